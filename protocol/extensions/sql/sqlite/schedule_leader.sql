-- The scheduling host says it still leads (for `cairnqd schedules`).
update cairnqd_schedules
set leader = :host, leader_seen_at_ms = :at_ms
