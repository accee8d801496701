-- A new task's edges to the parents it waits for, in the order they were named
-- (position 0 first).
insert into cairnqd_task_deps (task_id, parent_id, position)
select :task_id, parent, (n - 1)::integer
from unnest(:parents::text[]) with ordinality as named (parent, n)
