-- Run a failed or canceled task again, as if newly due. Everything the dead attempt left
-- behind is cleared except result, which is not an attempt artefact. reset_attempt is
-- 0/1 and gives the task its full max_attempts budget back.
update cairnq_tasks
set status = 'queued',
    attempt = case when :reset_attempt then 0 else attempt end,
    error = null,
    worker_id = null,
    lease_until_ms = null,
    cancel_requested_at_ms = null,
    completed_at_ms = null,
    progress = null,
    message = null,
    run_at_ms = :now_ms,
    updated_at_ms = :now_ms
where id = :id and status in ('failed', 'canceled')
returning *
