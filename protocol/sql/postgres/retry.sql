-- Run a failed or canceled task again, as if newly due. Everything the dead attempt left
-- behind is cleared except result, which is not an attempt artefact. reset_attempt is a
-- boolean and gives the task its full max_attempts budget back.
update cairnq_tasks
set status = 'queued',
    attempt = case when :reset_attempt::boolean then 0 else attempt end,
    error = null,
    worker_id = null,
    lease_until_ms = null,
    cancel_requested_at_ms = null,
    completed_at_ms = null,
    progress = null,
    message = null,
    run_at_ms = (extract(epoch from now()) * 1000)::bigint,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = :id and status in ('failed', 'canceled')
returning *
