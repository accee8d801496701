-- Make the slots 0 .. capacity-1 of one budget, free, where they do not exist yet: a
-- partition's budget is made the first time one of its tasks asks for room.
with recursive n(slot) as (
    select 0
    union all
    select slot + 1 from n where slot + 1 < :capacity
)
insert or ignore into cairnqd_limit_slots (limit_name, part, kind, slot)
select :limit_name, :part, :kind, slot from n
