-- Take or renew the lease :name for :holder until :ttl_ms from now (database clock),
-- if it is free, expired or already :holder's; never waits. A row comes back only when
-- :holder holds it now. The conflict update locks the row, so two hosts asking at once
-- get one answer each: exactly one of them holds it.
insert into cairnqd_leases as l (name, holder, expires_at_ms, taken_at_ms)
values (
    :name, :holder,
    (extract(epoch from clock_timestamp()) * 1000)::bigint + :ttl_ms,
    (extract(epoch from clock_timestamp()) * 1000)::bigint
)
on conflict (name) do update
set holder = excluded.holder,
    expires_at_ms = excluded.expires_at_ms,
    taken_at_ms = case when l.holder = excluded.holder then l.taken_at_ms
                       else excluded.taken_at_ms end
where l.holder = excluded.holder or l.expires_at_ms < excluded.taken_at_ms
returning holder
