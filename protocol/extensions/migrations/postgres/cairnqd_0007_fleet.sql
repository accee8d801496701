-- The fleet: one row per daemon that runs on this database, written when it starts,
-- stamped every few seconds while it runs and marked stopped when it stops cleanly, so
-- an operator (cairnqd fleet, the dashboard) sees which daemons are live, at which
-- version, and which fleet-wide features each honours. A daemon that died without a
-- stop goes silent and counts as gone once its stamp is older than the live window.
-- Rows are forgotten a day after their daemon stopped or went silent.
create table if not exists cairnqd_fleet (
    daemon text primary key check (length(daemon) between 1 and 255),
    host text not null,
    pid integer not null,
    config text not null,
    version text not null,
    pipe_protocol integer not null,
    -- JSON arrays of names: the features it honours, the groups it runs.
    features text not null,
    groups text not null,
    started_at_ms bigint not null,
    seen_at_ms bigint not null,
    stopped_at_ms bigint
);

-- The features that need every daemon's cooperation, and the migration that brought
-- each. A daemon reads this to name what it cannot honour when the database is ahead of
-- its code (a rollback): each later migration that brings such a feature adds its row.
create table if not exists cairnqd_features (
    feature text primary key,
    since text not null
);
insert into cairnqd_features (feature, since) values
    ('pauses', 'cairnqd_0002_queue_pauses.sql'),
    ('schedules', 'cairnqd_0003_schedules.sql'),
    ('fleet', 'cairnqd_0007_fleet.sql')
on conflict (feature) do nothing;
