-- An enqueue that failed; the slot stays due, and the next look tries it again.
update cairnqd_schedules
set last_error = :message, last_error_at_ms = :at_ms
where name = :name
