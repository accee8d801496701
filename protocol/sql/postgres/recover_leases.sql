-- Settle every running task whose lease has passed, in whatever queue. Runs first in each
-- claim transaction. A pending cancel wins (canceled, error untouched). Otherwise a task
-- with attempts left goes back to the queue, due now, with its worker and the dead
-- attempt's progress cleared. Otherwise it fails with the lease-expired envelope.
-- The lease is cleared on every branch. attempt is not touched: the claim counted it.
--
-- The clock is read once (scalar subselect over a CTE) so it bounds the partial lease
-- index, and from clock_timestamp() because the transaction may be old by now. Rows are
-- locked with skip locked so concurrent recoverers split the work instead of blocking
-- or deadlocking on each other. No ORDER BY: it would only sort rows we take anyway.
with clock as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
)
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
        when cancel_requested_at_ms is null and attempt < max_attempts
            then null
        else worker_id
    end,
    run_at_ms = case
        when cancel_requested_at_ms is null and attempt < max_attempts
            then (select now_ms from clock)
        else run_at_ms
    end,
    progress = case
        when cancel_requested_at_ms is null and attempt < max_attempts
            then null
        else progress
    end,
    message = case
        when cancel_requested_at_ms is null and attempt < max_attempts
            then null
        else message
    end,
    completed_at_ms = case
        when cancel_requested_at_ms is null and attempt < max_attempts then completed_at_ms
        else (select now_ms from clock)
    end,
    lease_until_ms = null,
    updated_at_ms = (select now_ms from clock)
where id in (
    select id from cairnq_tasks
    where status = 'running' and lease_until_ms is not null
      and lease_until_ms <= (select now_ms from clock)
    for update skip locked
)
returning id, queue, name, status
