-- Where a full budget holds work back (the dashboard's "throttled by" mark on a queue:
-- `LimitTable.holding_back` in cairnqd/store/tables/limits.py): the due tasks one limit
-- covers in the partitions :parts, per queue. Covered and partitioned as in
-- limit_waiting.sql.
select queue, count(*) as waiting
from cairnq_tasks
where status = 'queued'
  and run_at_ms <= :now_ms
  and (json_array_length(:queues) = 0 or queue in (select value from json_each(:queues)))
  and (json_array_length(:globs) = 0
       or exists (select 1 from json_each(:globs) as g where name glob g.value))
  and coalesce(
          case when :path is not null and json_valid(payload)
              then cast(json_extract(payload, :path) as text) end,
          '(none)'
      ) in (select value from json_each(:parts))
group by queue
order by queue
