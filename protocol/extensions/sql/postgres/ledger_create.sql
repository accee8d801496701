-- cairnqd's own migration ledger, kept apart from cairnq_migrations so upstream's future
-- file names can never collide with ours. Same shape as the shared ledger.
--
-- "if not exists" alone is not atomic: a cairnqd process racing another fails with a
-- unique-violation or duplicate-object error from the catalog once the winner commits.
-- The table then exists, which is all this statement promises, so those errors are
-- swallowed instead of failing the connect.
do $$
begin
    create table if not exists cairnqd_migrations (
        name text primary key,
        applied_at_ms bigint not null
    );
exception
    when unique_violation or duplicate_table or duplicate_object then
        null;
end
$$
