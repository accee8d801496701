-- Report progress. null leaves a field as it is, for both fields alike, so reporting a
-- message alone keeps the fraction. Status and lease do not change.
update cairnq_tasks
set progress = coalesce(:progress, progress),
    message = coalesce(:message, message),
    updated_at_ms = :now_ms
where id = :id
  and status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
  -- cairnqd's worker names the attempt it writes for, so a write that reaches the row
  -- late cannot settle a later attempt the same worker claimed meanwhile. Unnamed (the
  -- public SDK's calls), the store drops the filter (`specialize`).
  and (:attempt is null or attempt = :attempt)
returning *
