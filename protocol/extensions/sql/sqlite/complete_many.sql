-- complete for many tasks in one write. :items is a JSON array of {"id": ..., "r": ...,
-- "a": ...} where "r" is the result already encoded as JSON *text* (or null for a SQL
-- NULL result): carrying it as a string means SQLite hands back exactly the bytes the
-- store encoded, with no re-typing of numbers, booleans or strings on the way. "a",
-- when given, is the attempt the result belongs to: a row that has moved on to another
-- attempt (its lease lapsed, the same worker claimed it again) is left alone, so one
-- attempt's result never settles another.
-- Each row gets exactly what complete would give it: ownership is checked per row (a
-- missing id lost its lease), a pending cancel wins (canceled, result and progress
-- untouched), otherwise succeeded with its result and progress 1.0. Only id and status
-- come back.
update cairnq_tasks
set status = case when cancel_requested_at_ms is not null then 'canceled' else 'succeeded' end,
    result = case when cancel_requested_at_ms is not null then result else item.item_result end,
    progress = case when cancel_requested_at_ms is not null then progress else 1.0 end,
    lease_until_ms = null,
    completed_at_ms = :now_ms,
    updated_at_ms = :now_ms
from (
    select json_extract(value, '$.id') as item_id, json_extract(value, '$.r') as item_result,
        json_extract(value, '$.a') as item_attempt
    from json_each(:items)
) as item
where cairnq_tasks.id = item.item_id
  -- `+status` keeps the planner off the status indexes: json_each hides how short the
  -- id list is, and without this it walks every running row instead of probing ids.
  and +status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
  and (item.item_attempt is null or attempt = item.item_attempt)
returning id, status
