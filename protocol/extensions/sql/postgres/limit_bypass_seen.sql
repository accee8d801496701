-- The claims noted passing limit :limit_name by (limit_bypass_note.sql) and seen
-- running since :since_ms, the latest first.
select task_id as id, worker_id, name, queue, seen_at_ms
from cairnqd_limit_bypasses
where limit_name = :limit_name and seen_at_ms >= :since_ms
order by seen_at_ms desc, task_id
limit :limit
