-- cairnq protocol v1, SQLite: the three tables, the first claim index and the lookup
-- indexes. Every object is created only if missing and the meta rows are inserted only
-- if absent, so replaying this file over a live installation changes nothing.
--
-- Times are integer epoch milliseconds. Status is a CHECK, not a lookup table, so the
-- set of statuses stays visible in the DDL of both dialects. JSON columns are text
-- guarded by json_valid, so a writer cannot store something the other SDKs cannot parse.

create table if not exists cairnq_tasks (
    id                      text primary key,
    name                    text not null,
    queue                   text not null default 'default',
    status                  text not null
        check (status in ('queued', 'running', 'succeeded', 'failed', 'canceled')),
    payload                 text not null check (json_valid(payload)),
    result                  text check (result is null or json_valid(result)),
    error                   text check (error is null or json_valid(error)),
    metadata                text not null default '{}' check (json_valid(metadata)),
    progress                real,
    message                 text,
    attempt                 integer not null default 0,
    max_attempts            integer not null default 3,
    priority                integer not null default 0,
    worker_id               text,
    lease_until_ms          integer,
    run_at_ms               integer not null,
    cancel_requested_at_ms  integer,
    parent_id               text,
    root_id                 text,
    correlation_id          text,
    created_at_ms           integer not null,
    updated_at_ms           integer not null,
    completed_at_ms         integer
);

-- A key points at the current task for that business key. It lives in its own table so
-- a replaced task keeps its row while the key moves on; purging a task drops its key
-- (the cascade needs PRAGMA foreign_keys = ON on the deleting connection).
create table if not exists cairnq_task_keys (
    key            text primary key,
    task_id        text not null references cairnq_tasks (id) on delete cascade,
    created_at_ms  integer not null,
    updated_at_ms  integer not null
);

create table if not exists cairnq_meta (
    key    text primary key,
    value  text not null
);

-- Claim draws filter on queue and status and take the highest priority, oldest first.
-- 0008 replaces this definition with one ordered by run_at_ms, id.
create index if not exists cairnq_tasks_claim_idx
    on cairnq_tasks (queue, status, priority desc, created_at_ms);

-- Kept for the history of the sequence: 0010 drops it again.
create index if not exists cairnq_tasks_status_idx on cairnq_tasks (status);

-- Equality lookups used by list filters and chain navigation.
create index if not exists cairnq_tasks_name_idx on cairnq_tasks (name);
create index if not exists cairnq_tasks_root_idx on cairnq_tasks (root_id);
create index if not exists cairnq_tasks_correlation_idx on cairnq_tasks (correlation_id);

-- protocol_version is the one value every SDK checks on connect; never overwrite an
-- existing row (a newer protocol must not be silently downgraded).
insert into cairnq_meta (key, value)
values ('protocol_version', '1'), ('schema_version', '1')
on conflict (key) do nothing;
