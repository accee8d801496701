-- Give back the tasks a dead worker held but never started (claimed ahead of a free
-- slot, still waiting in its backlog when it died), and those whose attempt the
-- operator cut short (interruption_give.sql chose them). Their claim spent an attempt
-- that no handler used, or one the task is not to blame for, so the attempt is restored
-- and the task is queued again as if it had never been claimed: run_at_ms stays, so it
-- keeps its place in the queue; progress and message are cleared as on every requeue.
-- A pending cancel still wins (canceled, attempt untouched). :unstarted is a JSON array of
-- {"id": ..., "a": attempt}; a row matches only at that attempt, so a task the worker
-- did start under a later attempt is left to release_worker, which runs after this in
-- the same transaction. Rows are locked with skip locked, as release_worker does.
update cairnq_tasks as t
set status = case when t.cancel_requested_at_ms is not null then 'canceled' else 'queued' end,
    attempt = case when t.cancel_requested_at_ms is not null then t.attempt else t.attempt - 1 end,
    worker_id = case when t.cancel_requested_at_ms is not null then t.worker_id else null end,
    progress = case when t.cancel_requested_at_ms is not null then t.progress else null end,
    message = case when t.cancel_requested_at_ms is not null then t.message else null end,
    completed_at_ms = case
        when t.cancel_requested_at_ms is not null
            then (extract(epoch from now()) * 1000)::bigint
        else t.completed_at_ms
    end,
    lease_until_ms = null,
    updated_at_ms = (extract(epoch from now()) * 1000)::bigint
where t.id in (
    select c.id from cairnq_tasks as c
    join json_to_recordset(:unstarted::json) as u (id text, a integer)
        on u.id = c.id and u.a = c.attempt
    where c.status = 'running' and c.lease_until_ms is not null
      and c.worker_id = :worker_id
    for update of c skip locked
)
returning t.id, t.queue, t.name, t.status
