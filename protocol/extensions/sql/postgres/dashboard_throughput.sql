-- Tasks finished per queue, status and minute since :since_ms (the overview's chart of
-- the last hour). Reads the (status, completed_at_ms) index: the last hour's rows only.
select queue, status, completed_at_ms / 60000 as minute, count(*) as n
from cairnq_tasks
where status in ('succeeded', 'failed') and completed_at_ms >= :since_ms::bigint
group by queue, status, completed_at_ms / 60000
