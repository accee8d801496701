-- The worker's settlement of a successful handler. A pending cancel wins: the task ends
-- canceled and keeps its result and progress as they were. Otherwise it succeeds with
-- :result (null is SQL NULL) and progress 1.0. Either way the lease is cleared and
-- completed_at_ms stamped. worker_id stays for the audit trail.
update cairnq_tasks
set status = case when cancel_requested_at_ms is not null then 'canceled' else 'succeeded' end,
    result = case when cancel_requested_at_ms is not null then result else :result end,
    progress = case when cancel_requested_at_ms is not null then progress else 1.0 end,
    lease_until_ms = null,
    completed_at_ms = :now_ms,
    updated_at_ms = :now_ms
where id = :id
  and status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
  -- cairnqd's worker names the attempt it writes for, so a write that reaches the row
  -- late cannot settle a later attempt the same worker claimed meanwhile. Unnamed (the
  -- public SDK's calls), the store drops the filter (`specialize`).
  and (:attempt is null or attempt = :attempt)
returning *
