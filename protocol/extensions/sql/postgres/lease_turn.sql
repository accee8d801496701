-- Take the turn :name (the purge's) if it is due: one host per :every_ms across every
-- host on the database. The row's next_turn_at_ms moves :every_ms past now (database
-- clock) for the host whose row comes back; every other host asking before then gets
-- none. The host that took the last turn keeps it while it comes back on time: another
-- host takes over only once the turn has been due for :grace_ms, so one host sweeps
-- while it lives instead of whichever asks first. expires_at_ms is unused here.
insert into cairnqd_leases as l (name, holder, expires_at_ms, taken_at_ms, next_turn_at_ms)
values (
    :name, :holder, 0,
    (extract(epoch from clock_timestamp()) * 1000)::bigint,
    (extract(epoch from clock_timestamp()) * 1000)::bigint + :every_ms
)
on conflict (name) do update
set holder = excluded.holder,
    taken_at_ms = excluded.taken_at_ms,
    next_turn_at_ms = excluded.next_turn_at_ms
where (l.holder = excluded.holder and l.next_turn_at_ms <= excluded.taken_at_ms)
   or l.next_turn_at_ms + :grace_ms <= excluded.taken_at_ms
returning holder
