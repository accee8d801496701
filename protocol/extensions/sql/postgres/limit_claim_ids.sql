-- A limited claim takes the tasks its draw chose, by id, as claim.sql takes its own:
-- running under this worker, the lease measured from :now_ms (the clock the draw
-- counted the starts by, so a lease says when its start was counted), the attempt
-- counted. The
-- draw locked them, so each is still queued. The ids are a join, not `= any(...)`:
-- a prepared statement's generic plan cannot size an array and may then scan the
-- queued tasks instead of looking each id up.
with clock as (
    select coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
           as now_ms
)
update cairnq_tasks
set status = 'running',
    worker_id = :worker_id,
    lease_until_ms = (select now_ms from clock) + :lease_ms,
    attempt = attempt + 1,
    updated_at_ms = (select now_ms from clock)
where id in (select unnest(:ids::text[]))
  and status = 'queued'
returning *
