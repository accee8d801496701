-- A queued task is canceled at once. A running one only gets the cooperative flag (a
-- later cancel re-stamps it), and its worker settles it as canceled. Terminal tasks are
-- not matched, so the caller sees no row. SET expressions read the pre-update row.
update cairnq_tasks
set status = case when status = 'queued' then 'canceled' else status end,
    completed_at_ms = case when status = 'queued' then :now_ms else completed_at_ms end,
    cancel_requested_at_ms =
        case when status = 'running' then :now_ms else cancel_requested_at_ms end,
    updated_at_ms = :now_ms
where id = :id and status in ('queued', 'running')
returning *
