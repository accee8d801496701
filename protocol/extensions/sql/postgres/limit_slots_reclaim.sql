-- Free the concurrency slots of one budget whose claim has ended: the task is no
-- longer running under the worker and attempt that took the slot (it settled, its
-- lease was recovered, it was handed back or purged). Whoever ended it, a public SDK
-- worker included, the room comes back here, at the next claim that needs it.
-- Which slots are stale is read in this statement's snapshot, where a slot and the
-- claim that took it always appear together (one transaction wrote both). The update
-- then frees a slot only if it still names that same claim: a slot taken again
-- meanwhile is re-read in its newest version, names another claim, and is kept.
-- :pending lists, as a JSON array of {task_id, attempt}, the claims this transaction
-- is making: slots taken for them a moment ago, whose tasks are not running yet.
with stale as (
    select s.slot, s.task_id, s.worker_id, s.attempt
    from cairnqd_limit_slots s
    where s.limit_name = :limit_name and s.part = :part and s.kind = 'concurrency'
      and s.until_ms > 0
      and (s.task_id, s.attempt) not in (
          select p.task_id, p.attempt
          from json_to_recordset(:pending::json) as p(task_id text, attempt integer)
      )
      and not exists (
          select 1 from cairnq_tasks t
          where t.id = s.task_id and t.status = 'running'
            and t.worker_id = s.worker_id and t.attempt = s.attempt
      )
)
update cairnqd_limit_slots as s
set until_ms = 0, task_id = null, worker_id = null, attempt = null
from stale
where s.limit_name = :limit_name and s.part = :part and s.kind = 'concurrency'
  and s.slot = stale.slot
  and s.task_id = stale.task_id
  and s.worker_id = stale.worker_id
  and s.attempt = stale.attempt
returning s.slot
