-- Submit one task. Time is the database clock read once (a CTE with a volatile function
-- is evaluated once), from clock_timestamp() rather than now(): a keyed submit may have
-- waited on lock_key, and now() would stamp the transaction start instead.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
)
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, attempt, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
) values (
    :id, :name, :queue, 'queued', :payload::jsonb, :metadata::jsonb, 0, :max_attempts,
    :priority, :parent_id, :root_id, :correlation_id,
    (select now_ms from clock) + :delay_ms,
    (select now_ms from clock),
    (select now_ms from clock)
)
returning *
