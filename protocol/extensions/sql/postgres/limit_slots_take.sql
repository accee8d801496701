-- Take the lowest free slots of one budget (a limit's partition and kind) for a claim's
-- tasks, at most one each: :holders is a JSON array of {rn, task_id, attempt}, rn
-- counting from 1 in claim order, and the task numbered rn gets the rn-th free slot.
-- Only the slot rows decide: the first step locks each free slot it returns (skipping
-- one another claim holds locked) and re-reads its newest version before returning it,
-- so two claims can never both take the last free slot, whatever their snapshots saw.
-- Slots at or above :capacity are left from a larger budget: while any of them is still
-- taken, nothing is started (a lowered limit lets what runs finish first). Those slots
-- are only ever freed, never taken, so a stale read of them errs on the side of waiting.
with free as (
    select slot
    from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot < :capacity and until_ms <= :now_ms
    order by slot
    limit :n
    for update skip locked
),
numbered as (
    select slot, row_number() over (order by slot) as rn from free
),
holders as (
    select h.rn, h.task_id, h.attempt
    from json_to_recordset(:holders::json) as h(rn bigint, task_id text, attempt integer)
)
update cairnqd_limit_slots as s
set until_ms = :until_ms,
    task_id = holders.task_id,
    worker_id = :worker_id,
    attempt = holders.attempt
from numbered
join holders on holders.rn = numbered.rn
where s.limit_name = :limit_name and s.part = :part and s.kind = :kind
  and s.slot = numbered.slot
  and not exists (
      select 1 from cairnqd_limit_slots x
      where x.limit_name = :limit_name and x.part = :part and x.kind = :kind
        and x.slot >= :capacity and x.until_ms > :now_ms
  )
returning s.slot, s.task_id
