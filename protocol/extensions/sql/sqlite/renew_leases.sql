-- The worker's heartbeat: heartbeat_batch, each lease renewed for the attempt the worker
-- holds, and never moved earlier. :items is a JSON array of {"id": ..., "a": ...}.
-- Both differences are for a renewal that reaches its row late, its time bound before a
-- wait: it must not renew an attempt the same worker claimed since (the one it was
-- sent for having lapsed meanwhile), nor shorten a lease a later claim or renewal wrote
-- (see the Postgres statement). Ownership is checked per row as heartbeat_batch checks
-- it: a missing id has lost its lease.
update cairnq_tasks
set lease_until_ms = max(lease_until_ms, :lease_until_ms),
    updated_at_ms = :now_ms
from (
    select json_extract(value, '$.id') as held_id, json_extract(value, '$.a') as held_attempt
    from json_each(:items)
) as held
where cairnq_tasks.id = held.held_id and attempt = held.held_attempt
  -- `+status` keeps the planner off the status indexes: json_each hides how short the
  -- id list is, and without this it walks every running row instead of probing ids.
  and +status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
returning id, attempt, cancel_requested_at_ms
