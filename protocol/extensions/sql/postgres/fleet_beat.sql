-- A running daemon's stamp, with the groups it runs now. No row back: its row was
-- forgotten (silent past the prune), and the daemon joins again.
update cairnqd_fleet
set seen_at_ms = (extract(epoch from now()) * 1000)::bigint, groups = :groups
where daemon = :daemon and stopped_at_ms is null
returning daemon
