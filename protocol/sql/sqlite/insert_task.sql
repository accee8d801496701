-- Submit one task. The store computes now_ms once and run_at_ms = now_ms + delay_ms, so
-- an undelayed task is due the same millisecond it was created.
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, attempt, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
) values (
    :id, :name, :queue, 'queued', :payload, :metadata, 0, :max_attempts, :priority,
    :parent_id, :root_id, :correlation_id, :run_at_ms, :now_ms, :now_ms
)
returning *
