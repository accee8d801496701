-- complete for many tasks in one write. :items is a JSON array of {"id": ..., "r": ...,
-- "a": ...} where "r" is the result already encoded as JSON text (null for a SQL NULL
-- result), unpacked by json_to_recordset, and "a", when given, the attempt the result
-- belongs to: a row that has moved on to another attempt (its lease lapsed, the same
-- worker claimed it again) is left alone, so one attempt's result never settles another. Each row gets exactly what complete would give it:
-- ownership is checked per row (a missing id lost its lease), a pending cancel wins
-- (canceled, result and progress untouched), otherwise succeeded with its result and
-- progress 1.0. Only id and status come back.
-- The ownership test binds the running status as :running, like the other owned
-- writes, so a cached generic plan keeps probing the primary key per item.
-- The items are unpacked once, into one row: an object by id and the array of ids
-- (`m`). Each task is found by its primary key from that array and reads its result
-- from the object, so no plan joins the tasks to the item list: a plan made while few
-- tasks ran (statistics from a backlog all queued) read the running tasks by the lease
-- index and scanned the whole list, unpacked again, for each: 48 ms to settle 512
-- tasks beside a backlog of 60,000 where 16 ms do (bench/RESULTS.md, "Settling beside
-- a big backlog"). The status test is written so that no index serves it: in a long
-- drain the status index's 'running' range holds every dead version of the claims
-- until a vacuum, and a bitmap of it beside the key's cost a drain a sixth of its pace.
with m as materialized (
    select jsonb_object_agg(i.id, jsonb_build_object('r', i.r, 'a', i.a)) as obj,
           array_agg(i.id) as ids
    from json_to_recordset(:items::json) as i (id text, r text, a integer)
)
update cairnq_tasks as t
set status = case
        when t.cancel_requested_at_ms is not null then 'canceled'
        else 'succeeded'
    end,
    result = case
        when t.cancel_requested_at_ms is not null then t.result
        else (m.obj -> t.id ->> 'r')::jsonb
    end,
    progress = case when t.cancel_requested_at_ms is not null then t.progress else 1.0 end,
    lease_until_ms = null,
    completed_at_ms = (extract(epoch from now()) * 1000)::bigint,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
from m
where t.id = any(m.ids)
  and (t.status = :running) is true and t.worker_id = :worker_id
  and t.lease_until_ms > (extract(epoch from now()) * 1000)::bigint
  and ((m.obj -> t.id ->> 'a') is null or t.attempt = (m.obj -> t.id ->> 'a')::integer)
returning t.id, t.status
