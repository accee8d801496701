-- A worker counts a limit's running tasks (cairnqd_limit_workers): written in the
-- transaction of its claim, so no task it claims under the limit is ever taken for one
-- that passed the limit by.
insert into cairnqd_limit_workers (limit_name, worker_id, seen_at_ms)
values (:limit_name, :worker_id, :now_ms)
on conflict (limit_name, worker_id) do update set seen_at_ms = excluded.seen_at_ms
