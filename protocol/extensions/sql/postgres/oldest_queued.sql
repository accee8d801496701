-- Per queue, how long the oldest claimable task has been waiting (metrics, alerts on a
-- queue nobody consumes). Only due rows count: a delayed task is not late yet.
-- The age is numeric: a run_at another client wrote near the smallest bigint made the
-- bigint difference overflow and fail every caller (metrics, the dashboard, top).
select queue, (extract(epoch from now()) * 1000)::bigint::numeric - min(run_at_ms) as age_ms
from cairnq_tasks
where status = 'queued' and run_at_ms <= (extract(epoch from now()) * 1000)::bigint
group by queue
