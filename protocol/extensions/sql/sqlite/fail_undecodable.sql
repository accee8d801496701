-- Fail, at once and for good, a task that a claim took but cannot decode: another
-- client stored a value this runtime cannot read (text that is not UTF-8, JSON nested
-- deeper than it reads). Owned like every settlement: only by the worker that claimed
-- it, under the attempt it claimed (:attempt null: any attempt), lease unexpired. A
-- pending cancel still wins. An id that is not UTF-8 is bound as its raw bytes: cast to
-- text they equal the stored id byte for byte. Only the status comes back: the row's
-- other columns hold what could not be read.
update cairnq_tasks
set status = case when cancel_requested_at_ms is not null then 'canceled' else 'failed' end,
    error = :error,
    lease_until_ms = null,
    completed_at_ms = :now_ms,
    updated_at_ms = :now_ms
where id = cast(:id as text)
  and status = 'running' and worker_id = :worker_id
  and (:attempt is null or attempt = :attempt)
  and lease_until_ms > :now_ms
returning status
