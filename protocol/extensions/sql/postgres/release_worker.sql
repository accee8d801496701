-- Give back every task a worker holds, without waiting for its leases to expire (the
-- supervisor knows the process is gone). Same outcome per row as recover_leases: a
-- pending cancel wins (canceled, error untouched), a task with attempts left is queued
-- again due now, anything else fails with :error. The lease is always cleared and
-- attempt is not touched.
-- Rows are taken with skip locked: one still being settled by its (dying) worker's last
-- write is left to that write. "lease_until_ms is not null" adds nothing logically but
-- lets the partial lease index serve the scan.
update cairnq_tasks
set status = case
        when cancel_requested_at_ms is not null then 'canceled'
        when attempt < max_attempts then 'queued'
        else 'failed'
    end,
    error = case
        when cancel_requested_at_ms is null and attempt >= max_attempts then :error::jsonb
        else error
    end,
    worker_id = case
        when cancel_requested_at_ms is null and attempt < max_attempts then null
        else worker_id
    end,
    run_at_ms = case
        when cancel_requested_at_ms is null and attempt < max_attempts
            then (extract(epoch from now()) * 1000)::bigint
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
        else (extract(epoch from now()) * 1000)::bigint
    end,
    lease_until_ms = null,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id in (
    select id from cairnq_tasks
    where status = 'running' and lease_until_ms is not null
      and worker_id = :worker_id
    for update skip locked
)
returning id, queue, name, status, attempt
