-- Per-queue counters of finished tasks, kept by cairnqd workers so the dashboard can
-- chart an hour, a day or a week without reading the task table. Each worker adds its
-- own tallies every few seconds (cairnqd/_counters.py); rows of one period and queue
-- from several workers add up. Three widths are kept, each for as long as a chart
-- needs it: 60 s rows (the last hour), 900 s rows (a day), 3600 s rows (a week).
--
-- series names what a row counts: an outcome (succeeded, failed, retried, canceled,
-- lease_lost), each a histogram of its attempts' run times, or wait, a histogram of
-- the time from a task being due to its start. bucket is the histogram's bin
-- (cairnqd/_counters.py, "Buckets"); the count of a series is the sum of its bins.
-- cairnqd's own table, recorded in cairnqd_migrations.
create table if not exists cairnqd_queue_counts (
    width_s integer not null check (width_s in (60, 900, 3600)),
    start_ms bigint not null,
    queue text not null,
    series text not null,
    bucket integer not null check (bucket >= 0),
    n bigint not null check (n >= 0),
    primary key (width_s, start_ms, queue, series, bucket)
);
