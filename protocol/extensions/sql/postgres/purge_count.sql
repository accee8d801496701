-- What purge would delete, counted without deleting (`cairnqd purge --dry-run`): the
-- same predicate as purge.sql, on the database clock (or :now_ms when one is given).
select count(*) as n
from cairnq_tasks
where status in ('succeeded', 'failed', 'canceled')
  and completed_at_ms is not null
  and completed_at_ms < coalesce(:now_ms::bigint, (extract(epoch from now()) * 1000)::bigint)
      - :older_than_ms
  and (:queue::text is null or queue = :queue)
  and (:status::text is null or status = :status)
  and (:name::text is null or name = :name)
  and not exists (
    -- A parent a waiting task still needs (docs/workflows.md) stays.
    select 1 from cairnqd_task_deps d
    join cairnqd_task_waits w on w.task_id = d.task_id
    where d.parent_id = cairnq_tasks.id and w.failed_by is null
  )
