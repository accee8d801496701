-- Counts per queue and status, terminal rows included. A scan: dashboards, not polling.
-- The ::text on the first use types the parameter: an absent filter is bound as NULL,
-- and Postgres cannot infer a type from "is null" (it rejects the statement).
select queue, status, count(*) as n
from cairnq_tasks
where (:queue::text is null or queue = :queue)
group by queue, status
