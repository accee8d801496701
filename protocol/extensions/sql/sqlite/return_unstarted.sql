-- Give back the tasks a dead worker held but never started (claimed ahead of a free
-- slot, still waiting in its backlog when it died), and those whose attempt the
-- operator cut short (interruption_give.sql chose them). Their claim spent an attempt
-- that no handler used, or one the task is not to blame for, so the attempt is restored
-- and the task is queued again as if it had never been claimed: run_at_ms stays, so it
-- keeps its place in the queue; progress and message are cleared as on every requeue.
-- A pending cancel still wins (canceled, attempt untouched). :unstarted is a JSON array of
-- {"id": ..., "a": attempt}; a row matches only at that attempt, so a task the worker
-- did start under a later attempt is left to release_worker, which runs after this in
-- the same transaction.
update cairnq_tasks
set status = case when cancel_requested_at_ms is not null then 'canceled' else 'queued' end,
    attempt = case when cancel_requested_at_ms is not null then attempt else attempt - 1 end,
    worker_id = case when cancel_requested_at_ms is not null then worker_id else null end,
    progress = case when cancel_requested_at_ms is not null then progress else null end,
    message = case when cancel_requested_at_ms is not null then message else null end,
    completed_at_ms = case
        when cancel_requested_at_ms is not null then :now_ms
        else completed_at_ms
    end,
    lease_until_ms = null,
    updated_at_ms = :now_ms
where status = 'running' and lease_until_ms is not null
  and worker_id = :worker_id
  and exists (
    select 1 from json_each(:unstarted) as u
    where json_extract(u.value, '$.id') = cairnq_tasks.id
      and json_extract(u.value, '$.a') = cairnq_tasks.attempt
  )
returning id, queue, name, status
