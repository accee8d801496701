-- insert_task for a whole list in one statement (submit_many's keyless runs).
-- :new_tasks is a JSON array of objects; payload and metadata ride in it as JSON *text*
-- ("p", "m") so the stored bytes are exactly what the store encoded. Each row gets what
-- insert_task gives it: queued, attempt 0, run_at = now + delay, created = updated = now.
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
)
select
    json_extract(value, '$.id'),
    json_extract(value, '$.name'),
    json_extract(value, '$.queue'),
    'queued',
    json_extract(value, '$.p'),
    json_extract(value, '$.m'),
    json_extract(value, '$.max_attempts'),
    json_extract(value, '$.priority'),
    json_extract(value, '$.parent_id'),
    json_extract(value, '$.root_id'),
    json_extract(value, '$.correlation_id'),
    :now_ms + json_extract(value, '$.delay_ms'),
    :now_ms,
    :now_ms
from json_each(:new_tasks)
returning id, run_at_ms, created_at_ms
