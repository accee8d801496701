-- Per queue, how long the oldest claimable task has been waiting (metrics, alerts on a
-- queue nobody consumes). Only due rows count: a delayed task is not late yet. The
-- claim indexes lead with (queue, status), so this reads queued entries only.
select queue, :now_ms - min(run_at_ms) as age_ms
from cairnq_tasks
where status = 'queued' and run_at_ms <= :now_ms
group by queue
