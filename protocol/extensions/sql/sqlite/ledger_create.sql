-- cairnqd's own migration ledger, kept apart from cairnq_migrations so upstream's future
-- file names can never collide with ours. Same shape as the shared ledger.
create table if not exists cairnqd_migrations (
    name text primary key,
    applied_at_ms integer not null
)
