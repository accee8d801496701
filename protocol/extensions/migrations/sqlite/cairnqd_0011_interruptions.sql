-- Operator interruptions (docs/operations.md, "What a deploy does to running tasks"):
-- per task, how many times a stop the operator caused (a roll, a drain past
-- shutdown_timeout, QUIT) gave back the attempt it cut short. The count caps those
-- give-backs, so a task that never finishes within shutdown_timeout still ends. A row
-- lives while its task is queued or running; hand-backs forget the others.
-- cairnqd's own table, recorded in cairnqd_migrations.
create table if not exists cairnqd_interruptions (
    task_id text primary key,
    given integer not null check (given >= 1),
    updated_at_ms bigint not null
);
