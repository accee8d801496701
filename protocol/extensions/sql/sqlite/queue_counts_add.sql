-- Add a worker's tallies (:counts, a JSON array of {w, t, q, s, b, n}: width, period
-- start, queue, series, bucket, count) to the per-queue counters. ("where true" keeps
-- the upsert clause from being read as a join's.)
insert into cairnqd_queue_counts (width_s, start_ms, queue, series, bucket, n)
select json_extract(x.value, '$.w'), json_extract(x.value, '$.t'),
       json_extract(x.value, '$.q'), json_extract(x.value, '$.s'),
       json_extract(x.value, '$.b'), json_extract(x.value, '$.n')
from json_each(:counts) as x
where true
on conflict (width_s, start_ms, queue, series, bucket) do update
set n = cairnqd_queue_counts.n + excluded.n
