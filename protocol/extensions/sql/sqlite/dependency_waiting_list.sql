-- The tasks waiting on dependencies (list --waiting), newest first, optionally of one
-- queue and one task name; `matched` counts every one that matches, for the next page.
select t.*, count(*) over () as matched
from cairnqd_task_waits w
join cairnq_tasks t on t.id = w.task_id
where w.failed_by is null and t.status = 'queued'
  and (cast(:queue as text) is null or t.queue = :queue)
  and (cast(:name as text) is null or t.name = :name)
order by t.id desc
limit :limit offset :offset
