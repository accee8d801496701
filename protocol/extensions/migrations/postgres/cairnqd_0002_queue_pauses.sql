-- Queues an operator paused with `cairnqd pause --queue Q`: a daemon child claims only
-- from queues absent here (it re-reads the table about twice a second), on every host
-- that shares the database. cairnqd's own table, recorded in cairnqd_migrations; the
-- protocol's tables are untouched, so a public SDK worker does not see the pause.
create table if not exists cairnqd_queue_pauses (
    queue text primary key check (length(queue) between 1 and 255),
    paused_at_ms bigint not null,
    paused_by text not null,
    reason text check (reason is null or length(reason) <= 1000)
);
