-- The shared migration ledger: one row per applied file, named exactly as upstream names
-- it (file name with .sql), so either SDK sees the other's database as migrated.
-- Created outside any transaction, before the per-migration loop.
create table if not exists cairnq_migrations (
    name text primary key,
    applied_at_ms bigint not null
)
