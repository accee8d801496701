-- insert_task for a whole list in one statement (submit_many's keyless runs, and
-- concurrent submits sharing a statement). :new_tasks is a JSON array with one array
-- per task, its values in this order: id, name, queue, payload, metadata,
-- max_attempts, priority, parent_id, root_id, correlation_id, delay_ms. Positions
-- rather than named fields: the text is shorter to build and to parse (measured ~15%
-- cheaper per row than objects with these keys). payload and metadata ride in it as
-- JSON *text*, so the stored bytes are exactly what the store encoded. Each row gets
-- what insert_task gives it: queued, attempt 0, run_at = now + delay, created =
-- updated = now.
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
)
select
    json_extract(value, '$[0]'),
    json_extract(value, '$[1]'),
    json_extract(value, '$[2]'),
    'queued',
    json_extract(value, '$[3]'),
    json_extract(value, '$[4]'),
    json_extract(value, '$[5]'),
    json_extract(value, '$[6]'),
    json_extract(value, '$[7]'),
    json_extract(value, '$[8]'),
    json_extract(value, '$[9]'),
    :now_ms + json_extract(value, '$[10]'),
    :now_ms,
    :now_ms
from json_each(:new_tasks)
returning id, run_at_ms, created_at_ms
