-- Lower-level success: always succeeded, whatever the cancel flag says (complete is the
-- cancel-aware form). message is coalesced, so null keeps the last label.
-- The ownership test binds the running status as :running rather than the literal: with
-- the literal, a cached generic plan prefers the partial lease index over the primary
-- key. Time is now(), one value for the whole statement, as the protocol fixes for
-- owned writes.
update cairnq_tasks
set status = 'succeeded',
    result = :result::jsonb,
    progress = 1.0,
    message = coalesce(:message, message),
    lease_until_ms = null,
    completed_at_ms = (extract(epoch from now()) * 1000)::bigint,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = :id
  and status = :running and worker_id = :worker_id
  and lease_until_ms > (extract(epoch from now()) * 1000)::bigint
  -- cairnqd's worker names the attempt it writes for, so a write that reaches the row
  -- late cannot settle a later attempt the same worker claimed meanwhile. Unnamed (the
  -- public SDK's calls), the store drops the filter (`specialize`).
  and (:attempt::integer is null or attempt = :attempt)
returning *
