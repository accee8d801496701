-- Lower-level success: always succeeded, whatever the cancel flag says (complete is the
-- cancel-aware form). message is coalesced, so null keeps the last label.
update cairnq_tasks
set status = 'succeeded',
    result = :result,
    progress = 1.0,
    message = coalesce(:message, message),
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
