-- A daemon that stops cleanly leaves the fleet at once, rather than going silent.
update cairnqd_fleet
set stopped_at_ms = :now_ms, seen_at_ms = :now_ms
where daemon = :daemon
returning daemon
