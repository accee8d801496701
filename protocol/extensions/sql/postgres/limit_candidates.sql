-- A limited claim's draw (cairnqd/store/limits.py): the next claimable tasks in claim
-- order, locked for this transaction but not yet claimed, with what a limit needs to
-- decide whether each may start. The store completes the text before it runs:
-- {scope} becomes the claim's queues and task names (plain equalities for one queue
-- and one name, which the claim index walks in claim order without a sort),
-- {partitions} one column per payload field a limit partitions by
-- (`, coalesce(payload #>> '{tenant}', '(none)') as part_0`), and {excluded} a
-- condition matching the tasks of the budgets this claim already found full, so the
-- draw steps over them to the work behind them. now_ms is the clock every slot of
-- this claim is taken against.
select id, queue, name, attempt{partitions},
       coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint) as now_ms
from cairnq_tasks
where {scope}
  and status = 'queued'
  and run_at_ms <= coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
  and not ({excluded})
order by priority desc, run_at_ms asc, id asc
limit :limit
for update skip locked
