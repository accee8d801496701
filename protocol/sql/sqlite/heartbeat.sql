-- Extend the lease of a task this worker still owns. The ownership test is the same on
-- every owned write: running, same worker, lease not yet passed. An expired lease is
-- lost even if nobody has recovered it yet, so a late worker cannot revive it. No row
-- back means LostLease. The returned row carries cancel_requested_at_ms.
update cairnq_tasks
set lease_until_ms = :lease_until_ms,
    updated_at_ms = :now_ms
where id = :id
  and status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
returning *
