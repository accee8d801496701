-- What one limit's budgets hold now, per partition and kind (cairnqd limits, the
-- metrics). Concurrency, as the claim counts it on SQLite (limit_running.sql): the
-- tasks the limit covers that run now, on one of :queues (any when empty), named like
-- one of :globs (any when empty), partitioned by the payload field at the JSON path
-- :path (all in '(none)' when null). Rate: the starts still in their window, and when
-- the earliest of them leaves it.
select coalesce(
           case when :path is not null and json_valid(payload)
               then cast(json_extract(payload, :path) as text) end,
           '(none)'
       ) as part,
       'concurrency' as kind,
       count(*) as used,
       null as frees_at_ms,
       :now_ms as now_ms
from cairnq_tasks
where status = 'running'
  and lease_until_ms is not null
  and (json_array_length(:queues) = 0 or queue in (select value from json_each(:queues)))
  and (json_array_length(:globs) = 0
       or exists (select 1 from json_each(:globs) as g where name glob g.value))
group by 1
union all
select part, kind, count(*) as used, min(until_ms) as frees_at_ms, :now_ms as now_ms
from cairnqd_limit_slots
where limit_name = :limit_name
  and kind = 'rate'
  and until_ms > :now_ms
group by part, kind
order by 1, 2
