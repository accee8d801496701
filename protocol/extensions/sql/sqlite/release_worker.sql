-- Give back every task a worker holds, without waiting for its leases to expire (the
-- supervisor knows the process is gone). Same outcome per row as recover_leases: a
-- pending cancel wins (canceled, error untouched), a task with attempts left is queued
-- again due now, anything else fails with :error. The lease is always cleared and
-- attempt is not touched.
-- "lease_until_ms is not null" adds nothing logically (running implies a lease) but
-- repeats the partial lease index predicate, so the scan reads running rows only.
update cairnq_tasks
set status = case
        when cancel_requested_at_ms is not null then 'canceled'
        when attempt < max_attempts then 'queued'
        else 'failed'
    end,
    error = case
        when cancel_requested_at_ms is null and attempt >= max_attempts then :error
        else error
    end,
    worker_id = case
        when cancel_requested_at_ms is null and attempt < max_attempts then null
        else worker_id
    end,
    run_at_ms = case
        when cancel_requested_at_ms is null and attempt < max_attempts then :now_ms
        else run_at_ms
    end,
    progress = case
        when cancel_requested_at_ms is null and attempt < max_attempts then null
        else progress
    end,
    message = case
        when cancel_requested_at_ms is null and attempt < max_attempts then null
        else message
    end,
    completed_at_ms = case
        when cancel_requested_at_ms is null and attempt < max_attempts then completed_at_ms
        else :now_ms
    end,
    lease_until_ms = null,
    updated_at_ms = :now_ms
where status = 'running' and lease_until_ms is not null
  and worker_id = :worker_id
returning id, queue, name, status, attempt
