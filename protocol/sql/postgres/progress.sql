-- Report progress. null leaves a field as it is, for both fields alike, so reporting a
-- message alone keeps the fraction. Status and lease do not change.
-- The ownership test binds the running status as :running rather than the literal: with
-- the literal, a cached generic plan prefers the partial lease index over the primary
-- key. Time is now(), one value for the whole statement, as the protocol fixes for
-- owned writes.
update cairnq_tasks
set progress = coalesce(:progress, progress),
    message = coalesce(:message, message),
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = :id
  and status = :running and worker_id = :worker_id
  and lease_until_ms > (extract(epoch from now()) * 1000)::bigint
  -- cairnqd's worker names the attempt it writes for, so a write that reaches the row
  -- late cannot settle a later attempt the same worker claimed meanwhile. Unnamed (the
  -- public SDK's calls), the store drops the filter (`specialize`).
  and (:attempt::integer is null or attempt = :attempt)
returning *
