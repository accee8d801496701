-- Free the concurrency slots of one budget whose claim has ended: the task is no
-- longer running under the worker and attempt that took the slot (it settled, its
-- lease was recovered, it was handed back or purged). Whoever ended it, a public SDK
-- worker included, the room comes back here, at the next claim that needs it.
-- :pending lists, as a JSON array of {task_id, attempt}, the claims this transaction
-- is making: slots taken for them a moment ago, whose tasks are not running yet.
update cairnqd_limit_slots
set until_ms = 0, task_id = null, worker_id = null, attempt = null
where limit_name = :limit_name and part = :part and kind = 'concurrency'
  and until_ms > 0
  and task_id || ' ' || attempt not in (
      select json_extract(value, '$.task_id') || ' ' || json_extract(value, '$.attempt')
      from json_each(:pending)
  )
  and not exists (
      select 1 from cairnq_tasks t
      where t.id = cairnqd_limit_slots.task_id and t.status = 'running'
        and t.worker_id = cairnqd_limit_slots.worker_id
        and t.attempt = cairnqd_limit_slots.attempt
  )
returning slot
