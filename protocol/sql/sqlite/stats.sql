-- Counts per queue and status, terminal rows included. A scan: dashboards, not polling.
select queue, status, count(*) as n
from cairnq_tasks
where (:queue is null or queue = :queue)
group by queue, status
