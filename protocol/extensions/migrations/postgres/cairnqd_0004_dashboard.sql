-- The dashboard's task list pages through tasks newest first by creation, due time or
-- finish time with keyset paging: "(sort column, id) below the last row seen". These
-- indexes give each sort its order, so a page reads its rows from the index instead of
-- sorting the table (1,000,000 rows: milliseconds, not seconds). A status filter, the
-- most common one, has its own index for the creation order; finish order already has
-- (status, completed_at_ms). cairnqd's own indexes, recorded in cairnqd_migrations.
create index if not exists cairnqd_tasks_created_idx on cairnq_tasks (created_at_ms, id);
create index if not exists cairnqd_tasks_status_created_idx
    on cairnq_tasks (status, created_at_ms, id);
create index if not exists cairnqd_tasks_run_at_idx on cairnq_tasks (run_at_ms, id);

-- What each daemon that reports (dashboard.listen or dashboard.report) last said about
-- its groups and children, so a dashboard on any host shows the workers of every host:
-- one row per daemon (host/pid), rewritten every few seconds, dropped an hour after
-- its daemon stopped reporting. The snapshot is the JSON `cairnqd status --json` prints.
create table if not exists cairnqd_daemons (
    daemon text primary key check (length(daemon) between 1 and 255),
    host text not null,
    snapshot text not null,
    reported_at_ms bigint not null
);
