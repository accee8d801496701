-- Why one task waits (`cairnqd inspect`, the dashboard's task page: `LimitTable.
-- waiting_for` in cairnqd/store/tables/limits.py). When task :id is queued and due: the
-- partition it falls in for one limit (the payload field at the JSON path :path, as the
-- claim reads it in cairnqd/store/limits.py; '(none)' when the field is absent or null,
-- or :path is null) and what that partition's budgets hold now, counted as
-- limit_usage.sql counts them: the covered tasks that run (on one of :queues, named
-- like one of :globs; any when empty) and the rate's starts still in their window. A
-- task that is not queued, or not due, gives no row.
with task as (
    select coalesce(
               case when :path is not null and json_valid(payload)
                   then cast(json_extract(payload, :path) as text) end,
               '(none)'
           ) as part
    from cairnq_tasks
    where id = :id
      and status = 'queued'
      and run_at_ms <= :now_ms
),
running as (
    select count(*) as used
    from cairnq_tasks t, task
    where t.status = 'running'
      and t.lease_until_ms is not null
      and (json_array_length(:queues) = 0 or t.queue in (select value from json_each(:queues)))
      and (json_array_length(:globs) = 0
           or exists (select 1 from json_each(:globs) as g where t.name glob g.value))
      and coalesce(
              case when :path is not null and json_valid(t.payload)
                  then cast(json_extract(t.payload, :path) as text) end,
              '(none)'
          ) = task.part
),
rate as (
    select count(*) as used, min(s.until_ms) as frees_at_ms
    from cairnqd_limit_slots s, task
    where s.limit_name = :limit_name and s.part = task.part
      and s.kind = 'rate' and s.until_ms > :now_ms
)
select task.part, 'concurrency' as kind, running.used, null as frees_at_ms,
       :now_ms as now_ms
from task, running
union all
select task.part, 'rate' as kind, rate.used, rate.frees_at_ms, :now_ms as now_ms
from task, rate
order by 2
