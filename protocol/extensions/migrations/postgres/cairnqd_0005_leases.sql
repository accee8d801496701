-- cairnqd's own table, recorded in cairnqd_migrations: leadership that needs no session.
-- Behind a transaction pooler (PgBouncer pool_mode = transaction) a session advisory lock
-- is taken on one server connection and released (or checked) on another, so the daemon
-- leads with a row here instead: the host whose holder name is in the row leads until
-- expires_at_ms (database clock), renewing it while it works. The purge also keeps its
-- "one host per interval" turn here (next_turn_at_ms), with or without a pooler.
-- Postgres only: a SQLite file has one host. The protocol's tables are untouched.
create table if not exists cairnqd_leases (
    name text primary key,
    holder text not null,
    expires_at_ms bigint not null,
    taken_at_ms bigint not null,
    next_turn_at_ms bigint not null default 0
);
