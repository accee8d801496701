-- A concurrency limit's use on SQLite (cairnqd/store/limits.py, `LimitedClaims.
-- _count_running`): the tasks it covers that run now, whoever claimed them, per
-- partition. The claim that reads it holds the write lock, so the count cannot change
-- before the claim commits; a task leaves it the moment it stops running, however that
-- happens (settled, recovered, handed back, purged). The store completes the text:
-- {cover} is the limit's queues and name globs, {part} the partition's expression.
-- A running task always has a lease, which lets a limit without queues walk the
-- partial lease index instead of the whole table.
select {part} as part, count(*) as running
from cairnq_tasks
where status = 'running'
  and lease_until_ms is not null
  and {cover}
group by 1
