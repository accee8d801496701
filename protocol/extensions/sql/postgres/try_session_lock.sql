-- Take a session-level advisory lock if nobody holds it; never waits. The daemon's purge
-- sweep uses (lock_namespace, 1) so one host sweeps per interval. The two-int4 form puts
-- the lock in its own space (pg_locks.objsubid = 2), apart from the protocol's one-bigint
-- key locks, so no key hash can collide with it. A session lock, not a transaction one:
-- the sweep runs many short transactions on other connections while it is held.
select pg_try_advisory_lock(:lock_namespace::integer, :lock_id::integer) as locked
