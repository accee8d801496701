-- A new task's ancestors: its parents (written by dependency_link) and every ancestor
-- of theirs, so one statement can reach all the descendants of a failed task.
insert into cairnqd_task_ancestors (task_id, ancestor_id)
select :task_id, parent_id from cairnqd_task_deps where task_id = :task_id
union
select :task_id, a.ancestor_id
from cairnqd_task_deps d
join cairnqd_task_ancestors a on a.task_id = d.parent_id
where d.task_id = :task_id
