-- cairnqd's own table, recorded in cairnqd_migrations: what each configured schedule
-- (the daemon's schedules: section) last did, so the misfire policy and "exactly one
-- task per slot" hold across restarts and hosts. The protocol's tables are untouched.
--
-- last_slot_ms only moves forward, and a slot is enqueued in the same transaction that
-- moves it past that slot: a second host (or a restarted one) finds it moved and
-- enqueues nothing. rule is the timing rule last seen; a changed rule starts from its
-- next slot rather than catching up on the old one's.
create table if not exists cairnqd_schedules (
    name text primary key,
    rule text not null,
    last_slot_ms integer not null,
    last_fired_at_ms integer,
    last_fired_slot_ms integer,
    last_task_id text,
    fired_by text,
    last_error text,
    last_error_at_ms integer,
    misfires integer not null default 0 check (misfires >= 0),
    leader text,
    leader_seen_at_ms integer,
    updated_at_ms integer not null
);
