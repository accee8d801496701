-- Fail, at once and for good, a task that a claim took but cannot decode: another
-- client stored a value this runtime cannot read (jsonb nested deeper than it reads, a
-- number it refuses). Owned like every settlement: only by the worker that claimed it,
-- under the attempt it claimed (:attempt null: any attempt), lease unexpired. A pending
-- cancel still wins. Only the status comes back: the row's other columns hold what
-- could not be read.
update cairnq_tasks
set status = case when cancel_requested_at_ms is not null then 'canceled' else 'failed' end,
    error = :error::jsonb,
    lease_until_ms = null,
    completed_at_ms = (extract(epoch from now()) * 1000)::bigint,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = :id
  and status = :running and worker_id = :worker_id
  and (:attempt::integer is null or attempt = :attempt::integer)
  and lease_until_ms > (extract(epoch from now()) * 1000)::bigint
returning status
