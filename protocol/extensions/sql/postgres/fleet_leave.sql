-- A daemon that stops cleanly leaves the fleet at once, rather than going silent.
update cairnqd_fleet
set stopped_at_ms = (extract(epoch from now()) * 1000)::bigint, seen_at_ms = (extract(epoch from now()) * 1000)::bigint
where daemon = :daemon
returning daemon
