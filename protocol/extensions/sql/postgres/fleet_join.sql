-- A daemon joins the fleet as it starts: its row, fresh (a row under the same id, left
-- by an earlier run, is taken over).
-- Stamped with the database's clock, so every host's rows compare.
insert into cairnqd_fleet (
    daemon, host, pid, config, version, pipe_protocol, features, groups,
    started_at_ms, seen_at_ms, stopped_at_ms
)
values (
    :daemon, :host, :pid, :config, :version, :pipe_protocol, :features, :groups,
    (extract(epoch from now()) * 1000)::bigint, (extract(epoch from now()) * 1000)::bigint, null
)
on conflict (daemon) do update
set host = excluded.host, pid = excluded.pid, config = excluded.config,
    version = excluded.version, pipe_protocol = excluded.pipe_protocol,
    features = excluded.features, groups = excluded.groups,
    started_at_ms = excluded.started_at_ms, seen_at_ms = excluded.seen_at_ms,
    stopped_at_ms = null
