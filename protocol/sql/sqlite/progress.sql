-- Report progress. null leaves a field as it is, for both fields alike, so reporting a
-- message alone keeps the fraction. Status and lease do not change.
update cairnq_tasks
set progress = coalesce(:progress, progress),
    message = coalesce(:message, message),
    updated_at_ms = :now_ms
where id = :id
  and status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
returning *
