-- Running tasks whose lease has passed but that nobody has recovered yet (recovery only
-- happens inside some worker's claim). The predicate repeats the partial lease index
-- terms verbatim so SQLite reads that index, not the table.
select queue, count(*) as n
from cairnq_tasks
where status = 'running' and lease_until_ms is not null
  and lease_until_ms <= :now_ms
group by queue
