-- The per-queue counters of width :width_s from :since_ms on (a chart's range), for
-- the dashboard, in no order. Reads the primary key's range: a week of hourly rows at
-- most.
select start_ms, queue, series, bucket, n
from cairnqd_queue_counts
where width_s = :width_s and start_ms >= :since_ms::bigint
