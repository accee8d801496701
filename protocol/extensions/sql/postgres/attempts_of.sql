-- Every attempt of one task, in the order they ran (cairnqd inspect, the dashboard's
-- task page). The index on (task_id, attempt) serves it; started_at_ms orders a task
-- whose attempts were reset by a retry.
select task_id, attempt, worker_id, started_at_ms, finished_at_ms, outcome, detail, error
from cairnqd_attempts
where task_id = :task_id
order by started_at_ms, attempt
