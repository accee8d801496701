-- A limited claim in one statement, for the common case (cairnqd/store/limits.py,
-- `LimitedClaims._draw_one_budget`): every task the claim may take needs room in one
-- and the same budget, one limit covering the claim's queues whole, with one kind of
-- room (concurrency or rate) and no partitions. It takes as many of that budget's free
-- slots as it can, at most :n, the next claimable tasks up to that count, pairs them
-- in order (the task claimed k-th holds the k-th lowest free slot) and claims them
-- (the lease measured from the instant the slots count the start, as claim.sql does),
-- sparing the round trips of the general draw (candidates, slots, claim by id).
-- Both reads lock what they return (skip locked), so two claims never take the same
-- slot or task; a slot is free by its own columns alone, never by what a snapshot of
-- the tasks says. While a slot at or above :capacity (left from a larger budget) is
-- still taken, no slot is free: a lowered limit lets what runs finish first.
-- {scope} is the claim's queues and names, as in limit_candidates.sql. Every row
-- carries `room`: the free slots this claim found, and `room_now_ms`, the clock it
-- took them by; when none of them went to a task, one row of nulls carries them alone. A claim that got all the room there was (room
-- equal to the rows claimed) and wanted more found the budget full.
with clock as (
    select coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
           as now_ms
),
free as (
    select slot
    from cairnqd_limit_slots
    where limit_name = :limit_name and part = :part and kind = :kind
      and slot < :capacity and until_ms <= (select now_ms from clock)
      and not exists (
          select 1 from cairnqd_limit_slots x
          where x.limit_name = :limit_name and x.part = :part and x.kind = :kind
            and x.slot >= :capacity and x.until_ms > (select now_ms from clock)
      )
    order by slot
    limit :n
    for update skip locked
),
picked as (
    select id, attempt, priority, run_at_ms
    from cairnq_tasks
    where {scope}
      and status = 'queued'
      and run_at_ms <= (select now_ms from clock)
    order by priority desc, run_at_ms asc, id asc
    limit (select count(*) from free)
    for update skip locked
),
paired as (
    select p.id, p.attempt + 1 as attempt, f.slot
    from (
        select id, attempt,
               row_number() over (order by priority desc, run_at_ms asc, id asc) as rn
        from picked
    ) as p
    join (select slot, row_number() over (order by slot) as rn from free) as f
      on f.rn = p.rn
),
held as (
    update cairnqd_limit_slots as s
    set until_ms = coalesce(:held_ms::bigint, (select now_ms from clock) + :window_ms::bigint),
        task_id = paired.id,
        worker_id = :worker_id,
        attempt = paired.attempt
    from paired
    where s.limit_name = :limit_name and s.part = :part and s.kind = :kind
      and s.slot = paired.slot
    returning s.slot
),
claimed as (
    update cairnq_tasks as t
    set status = 'running',
        worker_id = :worker_id,
        lease_until_ms = (select now_ms from clock) + :lease_ms,
        attempt = paired.attempt,
        updated_at_ms = (select now_ms from clock)
    from paired
    where t.id = paired.id
    returning t.*
)
select claimed.*, room.room, (select now_ms from clock) as room_now_ms
from (select count(*) as room from free) as room
left join claimed on true
