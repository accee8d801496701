-- Add a worker's tallies (:counts, a JSON array of {w, t, q, s, b, n}: width, period
-- start, queue, series, bucket, count) to the per-queue counters. Rows go in key order,
-- so two workers adding to the same periods lock them in the same order.
insert into cairnqd_queue_counts as c (width_s, start_ms, queue, series, bucket, n)
select x.w, x.t, x.q, x.s, x.b, x.n
from json_to_recordset(:counts::json) as x(w integer, t bigint, q text, s text, b integer, n bigint)
order by x.w, x.t, x.q, x.s, x.b
on conflict (width_s, start_ms, queue, series, bucket) do update
set n = c.n + excluded.n
