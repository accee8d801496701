-- Running tasks whose lease has passed but that nobody has recovered yet (recovery only
-- happens inside some worker's claim). The predicate implies the partial lease index's.
select queue, count(*) as n
from cairnq_tasks
where status = 'running' and lease_until_ms is not null
  and lease_until_ms <= (extract(epoch from now()) * 1000)::bigint
group by queue
