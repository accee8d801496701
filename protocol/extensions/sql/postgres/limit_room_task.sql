-- Why one task waits (`cairnqd inspect`, the dashboard's task page: `LimitTable.
-- waiting_for` in cairnqd/store/tables/limits.py). When task :id is queued and due: the
-- partition it falls in for one limit (the payload field at :path, as the claim reads
-- it in cairnqd/store/limits.py; '(none)' when the field is absent or null, or :path is
-- null) and what that partition's budgets hold now, per kind, counted as
-- limit_usage.sql counts them. A partition without slots yet gives one row whose kind
-- is null; a task that is not queued, or not due, gives no row.
with clock as (
    select coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
        as now_ms
),
task as (
    select coalesce(payload #>> :path::text[], '(none)') as part
    from cairnq_tasks
    where id = :id
      and status = 'queued'
      and run_at_ms <= (select now_ms from clock)
)
select task.part, s.kind,
       sum(case
           when s.kind = 'rate' and s.until_ms > (select now_ms from clock) then 1
           when s.kind = 'concurrency' and s.until_ms > 0 and exists (
               select 1 from cairnq_tasks t
               where t.id = s.task_id and t.status = 'running'
                 and t.worker_id = s.worker_id and t.attempt = s.attempt
           ) then 1
           else 0
       end) as used,
       min(case when s.kind = 'rate' and s.until_ms > (select now_ms from clock)
           then s.until_ms end) as frees_at_ms,
       (select now_ms from clock) as now_ms
from task
left join cairnqd_limit_slots s on s.limit_name = :limit_name and s.part = task.part
group by task.part, s.kind
order by s.kind
