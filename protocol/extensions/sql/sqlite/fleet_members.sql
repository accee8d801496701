-- The daemons seen within :since_ms, each with its age and whether it is live: not
-- stopped, and stamped within :live_ms.
select daemon, host, pid, config, version, pipe_protocol, features, groups,
       started_at_ms, seen_at_ms, stopped_at_ms,
       :now_ms - seen_at_ms as age_ms,
       (stopped_at_ms is null and seen_at_ms >= :now_ms - :live_ms) as live
from cairnqd_fleet
where seen_at_ms >= :now_ms - :since_ms
order by host, pid, daemon
