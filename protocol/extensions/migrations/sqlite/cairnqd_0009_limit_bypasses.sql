-- Claims that passed a limit by (docs/limits.md, "What stays outside the guarantee"):
-- a running task a concurrency limit covers whose claim took none of its room, seen
-- by a daemon's maintenance (every few seconds) and kept for an hour, so a warning can
-- name a public SDK worker that claimed limited work even after its task has ended.
-- One row per limit, task and worker; seen_at_ms is the last time it was seen running.
-- cairnqd's own table, recorded in cairnqd_migrations.
create table if not exists cairnqd_limit_bypasses (
    limit_name text not null,
    task_id text not null,
    worker_id text not null,
    name text not null,
    queue text not null,
    seen_at_ms bigint not null,
    primary key (limit_name, task_id, worker_id)
);
