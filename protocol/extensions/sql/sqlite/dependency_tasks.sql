-- The parents of a task (ctx.dependencies()), whole rows, in the order its submit named
-- them. A parent deleted since (purged once it had succeeded) is left out.
select t.*
from cairnqd_task_deps d
join cairnq_tasks t on t.id = d.parent_id
where d.task_id = :task_id
order by d.position
