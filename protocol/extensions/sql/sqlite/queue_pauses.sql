-- Every paused queue: what workers that honour pauses leave alone (read by each daemon
-- child about twice a second; the table holds a handful of rows).
select queue, paused_at_ms, paused_by, reason
from cairnqd_queue_pauses
order by queue
