-- Flow-control budgets (docs/limits.md): one row per slot of a limit's budget, per
-- partition of it (a payload value, or '(none)') and kind. A start takes a free slot of
-- each budget the task needs, in the claim's transaction, and a slot can be taken by
-- one transaction only (its row is locked while it is taken), which is what keeps the
-- count airtight across workers and hosts.
--   concurrency: free when until_ms = 0; taken, until_ms holds a far-future sentinel
--     and (task_id, worker_id, attempt) names the claim holding it. A claim frees the
--     slots whose task no longer runs under that claim (settled, recovered, handed back).
--   rate: until_ms is when the start it recorded leaves the window; free from then on.
-- cairnqd's own table, recorded in cairnqd_migrations; the protocol's tables are
-- untouched, so workers that do not know limits (the public SDKs) bypass them.
create table if not exists cairnqd_limit_slots (
    limit_name text not null,
    part text not null,
    kind text not null check (kind in ('concurrency', 'rate')),
    slot integer not null check (slot >= 0),
    until_ms bigint not null default 0,
    task_id text,
    worker_id text,
    attempt integer,
    primary key (limit_name, part, kind, slot)
);

-- An operator's change to a limit (`cairnqd limits set`), for every host at once: the
-- workers read it within a second and keep it over their config's value until a reload
-- of the config clears it.
create table if not exists cairnqd_limit_overrides (
    limit_name text primary key,
    concurrency integer check (concurrency is null or concurrency between 1 and 10000),
    rate_count integer check (rate_count is null or rate_count between 1 and 10000),
    rate_window_ms bigint check (rate_window_ms is null or rate_window_ms >= 1),
    set_by text not null,
    set_at_ms bigint not null,
    reason text check (reason is null or length(reason) <= 1000)
);

insert into cairnqd_features (feature, since) values
    ('limits', 'cairnqd_0008_limits.sql')
on conflict (feature) do nothing;
