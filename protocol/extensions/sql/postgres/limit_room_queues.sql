-- Where a full budget holds work back (the dashboard's "throttled by" mark on a queue:
-- `LimitTable.holding_back` in cairnqd/store/tables/limits.py): the due tasks one limit
-- covers in the partitions :parts, per queue. Covered and partitioned as in
-- limit_waiting.sql.
select queue, count(*) as waiting
from cairnq_tasks
where status = 'queued'
  and run_at_ms <= coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
  and (cardinality(:queues::text[]) = 0 or queue = any(:queues::text[]))
  and (cardinality(:globs::text[]) = 0 or name like any(:globs::text[]))
  and coalesce(payload #>> :path::text[], '(none)') = any(:parts::text[])
group by queue
order by queue
