-- Delete up to :limit terminal rows finished strictly before before_ms, oldest first.
-- The status list and "completed_at_ms is not null" are spelled exactly as in the
-- partial/ordered indexes so SQLite can pick them: the queue filter reaches
-- cairnq_tasks_queue_completed_idx, the status filter cairnq_tasks_status_completed_idx,
-- and with neither the order comes from cairnq_tasks_completed_idx. Key rows cascade.
delete from cairnq_tasks
where id in (
    select id from cairnq_tasks
    where status in ('succeeded', 'failed', 'canceled')
      and completed_at_ms is not null
      and completed_at_ms < :before_ms
      and (:queue is null or queue = :queue)
      and (:status is null or status = :status)
      and (:name is null or name = :name)
      and not exists (
        -- A parent a waiting task still needs (docs/workflows.md) stays.
        select 1 from cairnqd_task_deps d
        join cairnqd_task_waits w on w.task_id = d.task_id
        where d.parent_id = cairnq_tasks.id and w.failed_by is null
      )
    order by completed_at_ms
    limit :limit
)
returning id
