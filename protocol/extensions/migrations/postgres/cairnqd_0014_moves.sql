-- `cairnqd move-to` (docs/operations.md, "Moving from SQLite to Postgres"): per source
-- file and table, how far a move from SQLite has come. Each batch of rows and its row
-- here commit in one transaction, so a move that was cut off carries on after
-- `last_key` (the source's primary key of the last row moved, as a JSON array) and
-- never writes a row twice. `started_at_ms` is the move's clock for the tasks it finds
-- running: the same on every run of one move, so a re-run settles them the same way.
-- Postgres only: a move's target is always Postgres.
-- cairnqd's own table, recorded in cairnqd_migrations.
create table if not exists cairnqd_moves (
    source text not null,
    table_name text not null,
    last_key text,
    moved bigint not null default 0 check (moved >= 0),
    skipped bigint not null default 0 check (skipped >= 0),
    started_at_ms bigint not null,
    updated_at_ms bigint not null,
    finished_at_ms bigint,
    primary key (source, table_name)
);
