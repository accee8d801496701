-- Remember the claims limit_bypass.sql found passing limit :limit_name by (:seen, a
-- JSON array of {id, worker_id, name, queue}), as seen now: a daemon's maintenance
-- notes them every few seconds so that a warning outlives the task (an hour).
insert into cairnqd_limit_bypasses (limit_name, task_id, worker_id, name, queue, seen_at_ms)
select :limit_name, b.id, b.worker_id, b.name, b.queue,
       coalesce(:now_ms::bigint, (extract(epoch from clock_timestamp()) * 1000)::bigint)
from json_to_recordset(:seen::json) as b(id text, worker_id text, name text, queue text)
on conflict (limit_name, task_id, worker_id) do update
set seen_at_ms = excluded.seen_at_ms
