-- Take the lowest free slot of one budget (a limit's partition and kind) for a task.
-- The claim holds the write lock, so no other claim reads or takes slots meanwhile.
-- Slots at or above :capacity are left from a larger budget: while any of them is
-- still taken, nothing is started (a lowered limit lets what runs finish first).
update cairnqd_limit_slots
set until_ms = :until_ms, task_id = :task_id, worker_id = :worker_id, attempt = :attempt
where rowid = (
    select rowid from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot < :capacity and until_ms <= :now_ms
    order by slot
    limit 1
)
and not exists (
    select 1 from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot >= :capacity and until_ms > :now_ms
)
returning slot
