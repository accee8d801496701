-- Make the slots 0 .. capacity-1 of one budget, free, where they do not exist yet: a
-- partition's budget is made the first time one of its tasks asks for room.
insert into cairnqd_limit_slots (limit_name, part, kind, slot)
select :limit_name, :part, :kind, n
from generate_series(0, :capacity::integer - 1) as n
on conflict do nothing
