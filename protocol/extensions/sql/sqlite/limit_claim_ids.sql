-- A limited claim takes the tasks its draw chose, by id, as claim.sql takes its own:
-- running under this worker, the lease measured from now, the attempt counted. The
-- unary + keeps the planner on the primary key (the status index would scan every
-- queued task for the few ids).
update cairnq_tasks
set status = 'running',
    worker_id = :worker_id,
    lease_until_ms = :lease_until_ms,
    attempt = attempt + 1,
    updated_at_ms = :now_ms
where id in (select value from json_each(:ids))
  and +status = 'queued'
returning *
