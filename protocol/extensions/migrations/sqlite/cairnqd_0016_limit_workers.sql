-- The workers that count a limit's running tasks (SQLite only: docs/limits.md, "How
-- they are kept"). A claim on SQLite holds the one write lock, so a concurrency limit
-- is kept by counting the covered tasks that run rather than by slot rows; what tells a
-- claim that went through the limit from one that passed it by (a public SDK worker, a
-- cairnqd worker configured without it) is then this table: a worker writes its row in
-- the transaction of its first claim under the limit, and renews it now and then.
-- A row whose worker has nothing running is forgotten after a day. cairnqd's own
-- table, recorded in cairnqd_migrations.
create table if not exists cairnqd_limit_workers (
    limit_name text not null,
    worker_id text not null,
    seen_at_ms integer not null,
    primary key (limit_name, worker_id)
);

-- Every cairnqd worker on the file must count this way: an older daemon, which takes
-- slots and counts only those, would not see the tasks a newer one runs. It names this
-- feature as one it does not honour when it connects (a rollback).
insert into cairnqd_features (feature, since) values
    ('limit_counts', 'cairnqd_0016_limit_workers.sql')
on conflict (feature) do nothing;
