-- Lower-level success: always succeeded, whatever the cancel flag says (complete is the
-- cancel-aware form). message is coalesced, so null keeps the last label.
update cairnq_tasks
set status = 'succeeded',
    result = :result,
    progress = 1.0,
    message = coalesce(:message, message),
    lease_until_ms = null,
    completed_at_ms = :now_ms,
    updated_at_ms = :now_ms
where id = :id
  and status = 'running' and worker_id = :worker_id and lease_until_ms > :now_ms
returning *
