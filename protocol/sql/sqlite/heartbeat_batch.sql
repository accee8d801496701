-- heartbeat for many tasks in one write. Ownership is checked per row: an id missing
-- from the result has lost its lease, the others are extended. Only the columns the
-- worker needs come back, so a batch of large payloads is not re-read every beat: the
-- attempt lets it tell which of its attempts of a task the lease now belongs to.
update cairnq_tasks
set lease_until_ms = :lease_until_ms,
    updated_at_ms = :now_ms
where id in (select value from json_each(:ids))
  -- `+status` keeps the planner off the status indexes: json_each hides how short the
  -- id list is, and without this it walks every running row instead of probing ids.
  and +status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
returning id, attempt, cancel_requested_at_ms
