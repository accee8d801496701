-- Per queue, the tasks waiting on dependencies: queued, but not due until their parents
-- succeed (stats shows them apart from the due ones).
select t.queue, count(*) as n
from cairnqd_task_waits w
join cairnq_tasks t on t.id = w.task_id
where w.failed_by is null and t.status = 'queued'
group by t.queue
