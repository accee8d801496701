-- insert_task for a whole list in one statement (submit_many's keyless runs): parallel
-- arrays, one element per task, unnested together. Each row gets what insert_task gives
-- it: queued, attempt 0, run_at = now + delay, created = updated = now (database clock).
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
)
select
    item.id, item.name, item.queue, 'queued', item.payload::jsonb, item.metadata::jsonb,
    item.max_attempts, item.priority, item.parent_id, item.root_id, item.correlation_id,
    now_ms.v + item.delay_ms, now_ms.v, now_ms.v
from unnest(
    :ids::text[], :task_names::text[], :task_queues::text[], :payloads::text[], :metadatas::text[],
    :max_attempts_list::integer[], :priorities::integer[], :parent_ids::text[],
    :root_ids::text[], :correlation_ids::text[], :delays::bigint[]
) as item (
    id, name, queue, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, delay_ms
)
cross join (select (extract(epoch from clock_timestamp()) * 1000)::bigint as v) as now_ms
returning *
