-- The due tasks one limit covers that wait to be claimed, per partition (cairnqd
-- limits, the metrics): on one of :queues (any when empty) and named like one of
-- :globs (any when empty), partitioned by the payload field at the JSON path :path
-- (all in '(none)' when null).
select coalesce(
           case when :path is not null and json_valid(payload)
               then cast(json_extract(payload, :path) as text) end,
           '(none)'
       ) as part,
       count(*) as waiting
from cairnq_tasks
where status = 'queued'
  and run_at_ms <= :now_ms
  and (json_array_length(:queues) = 0 or queue in (select value from json_each(:queues)))
  and (json_array_length(:globs) = 0
       or exists (select 1 from json_each(:globs) as g where name glob g.value))
group by 1
order by 1
