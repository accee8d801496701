-- insert_task for a whole list in one statement (submit_many's keyless runs).
-- :new_tasks is one JSON array of objects, unpacked by json_to_recordset on the server:
-- a single text parameter is far cheaper for the driver than a dozen parallel arrays.
-- payload and metadata ride in it as JSON *text* ("p", "m"). Each row gets what
-- insert_task gives it: queued, attempt 0, run_at = now + delay, created = updated =
-- now (database clock). Only the values the database chose come back.
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
)
select
    item.id, item.name, item.queue, 'queued', item.p::jsonb, item.m::jsonb,
    item.max_attempts, item.priority, item.parent_id, item.root_id, item.correlation_id,
    now_ms.v + item.delay_ms, now_ms.v, now_ms.v
from json_to_recordset(:new_tasks::json) as item (
    id text, name text, queue text, p text, m text, max_attempts integer,
    priority integer, parent_id text, root_id text, correlation_id text, delay_ms bigint
)
cross join (select (extract(epoch from clock_timestamp()) * 1000)::bigint as v) as now_ms
returning id, run_at_ms, created_at_ms
