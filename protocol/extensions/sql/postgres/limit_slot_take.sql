-- Take the lowest free slot of one budget (a limit's partition and kind) for a task.
-- Only the slot row itself decides: the inner select locks it (skipping a slot another
-- claim holds locked) and re-reads its newest version before taking it, so two claims
-- can never both take the last free slot, whatever their snapshots saw. Slots at or
-- above :capacity are left from a larger budget: while any of them is still taken,
-- nothing is started (a lowered limit lets what runs finish first). Those slots are
-- only ever freed, never taken, so a stale read of them errs on the side of waiting.
update cairnqd_limit_slots
set until_ms = :until_ms, task_id = :task_id, worker_id = :worker_id, attempt = :attempt
where (limit_name, part, kind, slot) = (
    select limit_name, part, kind, slot from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot < :capacity and until_ms <= :now_ms
    order by slot
    limit 1
    for update skip locked
)
and not exists (
    select 1 from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot >= :capacity and until_ms > :now_ms
)
returning slot
