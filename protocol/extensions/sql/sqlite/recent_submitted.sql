-- Tasks submitted from :from_id on, per queue (`cairnqd top`'s SUBMIT/s): a task id
-- begins with its ULID's time, so this reads a range of the primary key, only the
-- window's rows (cairnqd/_ids.py, task_id_floor). The key's index is named: for the
-- grouping by queue the planner otherwise prefers a full pass over a claim index.
select queue, count(*) as n
from cairnq_tasks indexed by sqlite_autoindex_cairnq_tasks_1
where id >= :from_id
group by queue
