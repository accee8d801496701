-- Extend the lease of a task this worker still owns: running, same worker, lease not yet
-- passed. An expired lease is lost even if nobody has recovered it yet, so a late worker
-- cannot revive it. No row back means LostLease. The returned row carries
-- cancel_requested_at_ms.
-- The ownership test binds the running status as :running rather than the literal: with
-- the literal, a cached generic plan prefers the partial lease index over the primary
-- key. Time is now(), one value for the whole statement, as the protocol fixes for
-- owned writes.
update cairnq_tasks
set lease_until_ms = (extract(epoch from now()) * 1000)::bigint + :lease_ms,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = :id
  and status = :running and worker_id = :worker_id
  and lease_until_ms > (extract(epoch from now()) * 1000)::bigint
returning *
