-- heartbeat for many tasks in one write. Ownership is checked per row: an id missing
-- from the result has lost its lease, the others are extended. Only the columns the
-- worker needs come back, so a batch of large payloads is not re-read every beat: the
-- attempt lets it tell which of its attempts of a task the lease now belongs to.
-- The ownership test binds the running status as :running rather than the literal: with
-- the literal, a cached generic plan prefers the partial lease index over the primary
-- key. Time is now(), one value for the whole statement, as the protocol fixes for
-- owned writes.
update cairnq_tasks
set lease_until_ms = (extract(epoch from now()) * 1000)::bigint + :lease_ms,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = any(:ids::text[])
  and status = :running and worker_id = :worker_id
  and lease_until_ms > (extract(epoch from now()) * 1000)::bigint
returning id, attempt, cancel_requested_at_ms
