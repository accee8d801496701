-- Take the lowest free slots of one budget (a limit's partition and kind) for a claim's
-- tasks, at most one each: :holders is a JSON array of {rn, task_id, attempt}, rn
-- counting from 1 in claim order, and the task numbered rn gets the rn-th free slot.
-- The claim holds the write lock, so no other claim reads or takes slots meanwhile.
-- Slots at or above :capacity are left from a larger budget: while any of them is still
-- taken, nothing is started (a lowered limit lets what runs finish first).
with free as (
    select rowid as rid, row_number() over (order by slot) as rn
    from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot < :capacity and until_ms <= :now_ms
    order by slot
    limit :n
),
holders as materialized (
    select json_extract(value, '$.rn') as rn,
           json_extract(value, '$.task_id') as task_id,
           json_extract(value, '$.attempt') as attempt
    from json_each(:holders)
)
update cairnqd_limit_slots
set until_ms = :until_ms,
    task_id = holders.task_id,
    worker_id = :worker_id,
    attempt = holders.attempt
from free
join holders on holders.rn = free.rn
where cairnqd_limit_slots.rowid = free.rid
  and not exists (
      select 1 from cairnqd_limit_slots x
      where x.limit_name = :limit_name and x.part = :part and x.kind = :kind
        and x.slot >= :capacity and x.until_ms > :now_ms
  )
returning slot, task_id
