-- The due tasks one limit covers that wait to be claimed, per partition (cairnqd
-- limits, the metrics): on one of :queues (any when empty) and named like one of
-- :globs (LIKE patterns; any when empty), partitioned by the payload field at :path
-- (all in '(none)' when null).
select coalesce(payload #>> :path::text[], '(none)') as part, count(*) as waiting
from cairnq_tasks
where status = 'queued'
  and run_at_ms <= coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
  and (cardinality(:queues::text[]) = 0 or queue = any(:queues::text[]))
  and (cardinality(:globs::text[]) = 0 or name like any(:globs::text[]))
group by 1
order by 1
