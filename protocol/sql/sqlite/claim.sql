-- Claim up to :limit due tasks from several queues (and, unless names is null, only
-- the listed task names). The list filters are read with json_each, which the planner
-- cannot turn into an ordered index walk, so this form sorts the claimable rows. The
-- single-queue and single-name variants exist to avoid that sort.
-- Runs inside BEGIN IMMEDIATE, so no other writer can take the same rows. Order is
-- priority desc, run_at_ms, id (the claim indexes' order). attempt counts the claim.
-- The rows come back in table order, not claim order.
-- The draw hands the update rowids, which every index entry carries, so the update
-- goes straight to each row instead of looking its id up in the primary key first.
update cairnq_tasks
set status = 'running',
    worker_id = :worker_id,
    lease_until_ms = :lease_until_ms,
    attempt = attempt + 1,
    updated_at_ms = :now_ms
where rowid in (
    select rowid from cairnq_tasks
    where queue in (select value from json_each(:queues))
      and status = 'queued'
      and (:names is null or name in (select value from json_each(:names)))
      and run_at_ms <= :now_ms
    order by priority desc, run_at_ms asc, id asc
    limit :limit
)
returning *
