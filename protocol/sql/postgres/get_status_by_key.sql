-- Re-resolves the key on every call, so a waiter follows a replace.
select t.id, t.status
from cairnq_task_keys as k
join cairnq_tasks as t on t.id = k.task_id
where k.key = :key
