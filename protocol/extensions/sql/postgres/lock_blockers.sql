-- Who holds the locks that sessions of this database are waiting for: the daemon asks
-- when a worker's claims or lease renewals have made no progress for a while, so its
-- warning can name the session in the way (a `LOCK TABLE`, a long migration, an
-- abandoned transaction). One row per blocking session, the longest-held first.
select distinct
    blocker.pid,
    blocker.usename as user_name,
    blocker.application_name,
    host(blocker.client_addr) as client_addr,
    blocker.state,
    extract(epoch from now() - blocker.xact_start)::float8 as held_s,
    left(regexp_replace(blocker.query, '\s+', ' ', 'g'), 200) as query
from pg_stat_activity as waiter
cross join lateral unnest(pg_blocking_pids(waiter.pid)) as blocking(pid)
join pg_stat_activity as blocker on blocker.pid = blocking.pid
where waiter.datname = current_database()
    and waiter.wait_event_type = 'Lock'
order by held_s desc nulls last
limit 5
