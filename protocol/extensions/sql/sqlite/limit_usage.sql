-- What one limit's budgets hold now, per partition and kind (cairnqd limits, the
-- metrics): the slots taken, counting a concurrency slot only while its claim still
-- runs (a slot whose task settled is free in all but name until the next claim
-- reclaims it), and when the earliest rate slot frees.
select s.part, s.kind,
       sum(case
           when s.kind = 'rate' and s.until_ms > :now_ms then 1
           when s.kind = 'concurrency' and s.until_ms > 0 and exists (
               select 1 from cairnq_tasks t
               where t.id = s.task_id and t.status = 'running'
                 and t.worker_id = s.worker_id and t.attempt = s.attempt
           ) then 1
           else 0
       end) as used,
       min(case when s.kind = 'rate' and s.until_ms > :now_ms then s.until_ms end)
           as frees_at_ms,
       :now_ms as now_ms
from cairnqd_limit_slots s
where s.limit_name = :limit_name
group by s.part, s.kind
order by s.part, s.kind
