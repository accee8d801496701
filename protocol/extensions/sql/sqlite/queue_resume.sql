-- Resume one queue (`cairnqd resume`); no row back when it was not paused.
delete from cairnqd_queue_pauses
where queue = :queue
returning queue, paused_at_ms, paused_by, reason
