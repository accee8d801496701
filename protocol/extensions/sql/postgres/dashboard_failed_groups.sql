-- Failed tasks grouped by task name and error type (the dashboard's Failed page), the
-- biggest groups first, with the newest failure of each and one of its messages.
select name, coalesce(error ->> 'type', '') as error_type, count(*) as n,
       max(completed_at_ms) as last_ms, max(error ->> 'message') as message
from cairnq_tasks
where status = 'failed'
group by name, coalesce(error ->> 'type', '')
order by n desc, name, error_type
limit :limit
