-- Tasks that ended from :since_ms on, per queue and status (`cairnqd top`'s FINISH/s
-- and FAIL/s): a range of cairnq_tasks_completed_idx, only the window's rows. Named:
-- for the grouping the planner otherwise prefers a full pass over a claim index.
select queue, status, count(*) as n
from cairnq_tasks indexed by cairnq_tasks_completed_idx
where completed_at_ms >= :since_ms
group by queue, status
