-- Tasks that ended from :since_ms on, per queue and status (`cairnqd top`'s FINISH/s
-- and FAIL/s): a range of cairnq_tasks_completed_idx, only the window's rows.
select queue, status, count(*) as n
from cairnq_tasks
where completed_at_ms >= :since_ms::bigint
group by queue, status
