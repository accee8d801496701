-- The shared migration ledger: one row per applied file, named exactly as upstream names
-- it (file name with .sql), so either SDK sees the other's database as migrated.
-- Created outside any transaction, before the per-migration loop.
--
-- "if not exists" alone is not atomic: when processes (ours or upstream's) cold-start
-- together, the loser fails with a unique-violation or duplicate-object error from the
-- catalog once the winner commits. The table then exists, which is all this statement
-- promises, so those errors are swallowed instead of failing the connect.
do $$
begin
    create table if not exists cairnq_migrations (
        name text primary key,
        applied_at_ms bigint not null
    );
exception
    when unique_violation or duplicate_table or duplicate_object then
        null;
end
$$
