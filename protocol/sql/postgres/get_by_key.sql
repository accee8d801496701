-- Both lookups are primary-key probes.
select t.*
from cairnq_task_keys as k
join cairnq_tasks as t on t.id = k.task_id
where k.key = :key
