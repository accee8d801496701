-- Remember the claims limit_bypass.sql found passing limit :limit_name by (:seen, a
-- JSON array of {id, worker_id, name, queue}), as seen now: a daemon's maintenance
-- notes them every few seconds so that a warning outlives the task (an hour).
insert into cairnqd_limit_bypasses (limit_name, task_id, worker_id, name, queue, seen_at_ms)
select :limit_name,
       json_extract(value, '$.id'),
       json_extract(value, '$.worker_id'),
       json_extract(value, '$.name'),
       json_extract(value, '$.queue'),
       :now_ms
from json_each(:seen)
where true
on conflict (limit_name, task_id, worker_id) do update
set seen_at_ms = excluded.seen_at_ms
