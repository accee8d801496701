-- Which of a worker's running tasks an operator asked to cancel: the worker reads this
-- about once a second while a handler runs (never when none does), so a handler that
-- never calls ctx.canceled() is still stopped soon after `cancel`. A read by primary
-- key for a handful of ids; only the rows with the flag come back, usually none. The
-- attempt tells the worker which of its attempts of a task the row is now at.
-- The running status is bound as :running rather than the literal, as in
-- heartbeat_batch: a cached generic plan keeps to the primary key.
select id, attempt from cairnq_tasks
where id = any(:ids::text[])
  and status = :running and worker_id = :worker_id
  and cancel_requested_at_ms is not null
