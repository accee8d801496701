-- The tasks submitted `after` a task (inspect, the dashboard), whole rows, oldest
-- first, at most :limit (all when it is null).
select t.*
from cairnqd_task_deps d
join cairnq_tasks t on t.id = d.task_id
where d.parent_id = :task_id
order by t.id
limit :limit
