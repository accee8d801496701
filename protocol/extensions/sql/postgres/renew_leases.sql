-- The worker's heartbeat: heartbeat_batch, each lease renewed for the attempt the worker
-- holds, and never moved earlier. :items is a JSON array of {"id": ..., "a": ...}.
-- Both differences are for a renewal that reaches its row late. now() is the start of
-- the statement's transaction, read when the statement arrived, before any wait for a
-- lock, so a renewal that waited behind another client's lock writes "now + lease" from
-- a time long gone:
-- - meanwhile the lease may have ended, the task been recovered and the same worker
--   claimed it again: a renewal naming ids only then renewed the new attempt, with a
--   lease already over, and the task ran a third time beside the second. The attempt
--   in each item keeps a renewal to the attempt it was sent for;
-- - a later claim or renewal of the same attempt may already have written a lease
--   further out, which the worker counts on: greatest() keeps it.
-- Ownership is checked per row as heartbeat_batch checks it (a missing id has lost its
-- lease). The items are unpacked once, into the array of ids and an object keyed
-- "id/attempt", so each task is found by a primary key probe from the array, as
-- complete_many finds its rows, and its attempt checked by one lookup: joined to the
-- item list instead, the planner walked the lease or the status index over every
-- running task. For the same reason the status test is written so that no index
-- serves it.
with held as materialized (
    select array_agg(h.id) as ids, jsonb_object_agg(h.id || '/' || h.a, true) as pairs
    from json_to_recordset(:items::json) as h (id text, a integer)
)
update cairnq_tasks as t
set lease_until_ms = greatest(
        t.lease_until_ms, (extract(epoch from now()) * 1000)::bigint + :lease_ms
    ),
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
from held
where t.id = any(held.ids)
  and (held.pairs -> (t.id || '/' || t.attempt)) is not null
  and (t.status = :running) is true and t.worker_id = :worker_id
  and t.lease_until_ms > (extract(epoch from now()) * 1000)::bigint
returning t.id, t.attempt, t.cancel_requested_at_ms
