-- A queued task is canceled at once. A running one only gets the cooperative flag (a
-- later cancel re-stamps it), and its worker settles it as canceled. Terminal tasks are
-- not matched, so the caller sees no row. SET expressions read the pre-update row, and a
-- row changed concurrently is re-checked against the WHERE before it is written.
update cairnq_tasks
set status = case when status = 'queued' then 'canceled' else status end,
    completed_at_ms = case
        when status = 'queued' then (extract(epoch from now()) * 1000)::bigint
        else completed_at_ms
    end,
    cancel_requested_at_ms = case
        when status = 'running' then (extract(epoch from now()) * 1000)::bigint
        else cancel_requested_at_ms
    end,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where id = :id and status in ('queued', 'running')
returning *
