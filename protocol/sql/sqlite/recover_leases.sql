-- Settle every running task whose lease has passed, in whatever queue. Runs first in each
-- claim transaction. A pending cancel wins (canceled, error untouched). Otherwise a task
-- with attempts left goes back to the queue, due now, with its worker and the dead
-- attempt's progress cleared. Otherwise it fails with the lease-expired envelope.
-- The lease is cleared on every branch. attempt is not touched: the claim counted it.
-- The WHERE repeats the partial lease index predicate verbatim so SQLite uses it.
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
  and lease_until_ms <= :now_ms
returning id, queue, name, status
