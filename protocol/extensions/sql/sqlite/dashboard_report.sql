-- A daemon's report of its groups and children (see cairnqd_daemons), replacing its last.
insert into cairnqd_daemons (daemon, host, snapshot, reported_at_ms)
values (:daemon, :host, :snapshot, :now_ms)
on conflict (daemon) do update
set host = excluded.host, snapshot = excluded.snapshot, reported_at_ms = excluded.reported_at_ms
