-- Up to release 0.2.0 this migration also built three indexes on cairnq_tasks for the
-- dashboard, which cairnqd_0006 drops again: a write stall on a large table for nothing.
-- They are built on demand now (protocol/extensions/on_demand/), so this file no longer
-- makes them; a database that ran the earlier text loses them in cairnqd_0006.

-- What each daemon that reports (dashboard.listen or dashboard.report) last said about
-- its groups and children, so a dashboard on any host shows the workers of every host:
-- one row per daemon (host/pid), rewritten every few seconds, dropped an hour after
-- its daemon stopped reporting. The snapshot is the JSON `cairnqd status --json` prints.
create table if not exists cairnqd_daemons (
    daemon text primary key check (length(daemon) between 1 and 255),
    host text not null,
    snapshot text not null,
    reported_at_ms integer not null
);
