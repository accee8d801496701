-- Delete up to :limit terminal rows finished strictly before now - older_than_ms, oldest
-- first. The subselect locks what it picks and skips rows another transaction holds:
-- without that, a task retried concurrently (no longer terminal once that commits) could
-- be deleted by a purge that read it as terminal. The status list matches the partial
-- queue index so a queue-filtered purge can use it. Key rows cascade.
-- The ::text on the first use types the parameter: an absent filter is bound as NULL,
-- and Postgres cannot infer a type from "is null" (it rejects the statement).
-- now is the database clock unless :now_ms is given (a test's clock; NULL otherwise).
delete from cairnq_tasks
where id in (
    select id from cairnq_tasks
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
    order by completed_at_ms
    limit :limit
    for update skip locked
)
returning id
