-- A daemon's report of its groups and children (see cairnqd_daemons), replacing its last.
-- The database's clock, as every host's report is compared with the others'.
insert into cairnqd_daemons (daemon, host, snapshot, reported_at_ms)
values (:daemon, :host, :snapshot, (extract(epoch from now()) * 1000)::bigint)
on conflict (daemon) do update
set host = excluded.host, snapshot = excluded.snapshot, reported_at_ms = excluded.reported_at_ms
