-- Settle a failed attempt, in one statement so no reader sees a half-written outcome.
--   1. a pending cancel wins: canceled, completed_at_ms stamped, worker_id kept;
--   2. retryable (0/1) with attempts left: back to queued, due at run_at_ms (now plus
--      the backoff the SDK chose), worker, completion time, progress and message cleared
--      so the next attempt starts clean;
--   3. otherwise failed, completed_at_ms stamped, worker_id kept.
-- The error is recorded and the lease cleared on every branch.
update cairnq_tasks
set status = case
        when cancel_requested_at_ms is not null then 'canceled'
        when :retryable and attempt < max_attempts then 'queued'
        else 'failed'
    end,
    worker_id = case
        when cancel_requested_at_ms is null and :retryable and attempt < max_attempts
            then null
        else worker_id
    end,
    run_at_ms = case
        when cancel_requested_at_ms is null and :retryable and attempt < max_attempts
            then :run_at_ms
        else run_at_ms
    end,
    completed_at_ms = case
        when cancel_requested_at_ms is null and :retryable and attempt < max_attempts
            then null
        else :now_ms
    end,
    progress = case
        when cancel_requested_at_ms is null and :retryable and attempt < max_attempts
            then null
        else progress
    end,
    message = case
        when cancel_requested_at_ms is null and :retryable and attempt < max_attempts
            then null
        else message
    end,
    error = :error,
    lease_until_ms = null,
    updated_at_ms = :now_ms
where id = :id
  and status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
  -- cairnqd's worker names the attempt it writes for, so a write that reaches the row
  -- late cannot settle a later attempt the same worker claimed meanwhile. Unnamed (the
  -- public SDK's calls), the store drops the filter (`specialize`).
  and (:attempt is null or attempt = :attempt)
returning *
