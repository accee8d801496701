-- A limited claim's draw (cairnqd/store/limits.py): the next claimable tasks in claim
-- order, with what a limit needs to decide whether each may start. The claim holds
-- the write lock, so nothing changes under it. The store completes the text before it
-- runs: {scope} becomes the claim's queues and task names (plain equalities for one
-- queue and one name, which the claim index walks in claim order without a sort),
-- {partitions} one column per payload field a limit partitions by, and {excluded} a
-- condition matching the tasks of the budgets this claim already found full, so the
-- draw steps over them to the work behind them.
select id, queue, name, attempt{partitions}, :now_ms as now_ms
from cairnq_tasks
where {scope}
  and status = 'queued'
  and run_at_ms <= :now_ms
  and not ({excluded})
order by priority desc, run_at_ms asc, id asc
limit :limit
