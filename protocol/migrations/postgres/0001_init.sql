-- cairnq protocol v1, Postgres: the three tables, the first claim index and the lookup
-- indexes. Every object is created only if missing and the meta rows are inserted only
-- if absent, so replaying this file over a live installation changes nothing.
--
-- Times are bigint epoch milliseconds, never timestamptz: both dialects and both SDKs
-- then compare the same integers. Status is a CHECK rather than an enum type, so adding
-- a status later is a constraint swap, not an ALTER TYPE that cannot run in a
-- transaction on older servers. JSON columns are jsonb, which validates on input.

create table if not exists cairnq_tasks (
    id                      text primary key,
    name                    text not null,
    queue                   text not null default 'default',
    status                  text not null
        check (status in ('queued', 'running', 'succeeded', 'failed', 'canceled')),
    payload                 jsonb not null,
    result                  jsonb,
    error                   jsonb,
    metadata                jsonb not null default '{}'::jsonb,
    progress                double precision,
    message                 text,
    attempt                 integer not null default 0,
    max_attempts            integer not null default 3,
    priority                integer not null default 0,
    worker_id               text,
    lease_until_ms          bigint,
    run_at_ms               bigint not null,
    cancel_requested_at_ms  bigint,
    parent_id               text,
    root_id                 text,
    correlation_id          text,
    created_at_ms           bigint not null,
    updated_at_ms           bigint not null,
    completed_at_ms         bigint
);

-- A key points at the current task for that business key. It lives in its own table so
-- a replaced task keeps its row while the key moves on, and purging a task drops its key.
create table if not exists cairnq_task_keys (
    key            text primary key,
    task_id        text not null references cairnq_tasks (id) on delete cascade,
    created_at_ms  bigint not null,
    updated_at_ms  bigint not null
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

-- protocol_version is the one value every SDK checks on connect. Never overwrite an
-- existing row: a newer protocol must not be silently downgraded.
insert into cairnq_meta (key, value)
values ('protocol_version', '1'), ('schema_version', '1')
on conflict (key) do nothing;
