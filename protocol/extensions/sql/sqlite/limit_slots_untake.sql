-- Give back the slots this claim took a moment ago for tasks that then found another
-- of their budgets full: those tasks are not started, so they hold nothing. :held is
-- a JSON array of {task_id, attempt}: the claim's own, never an earlier attempt's start.
update cairnqd_limit_slots
set until_ms = 0, task_id = null, worker_id = null, attempt = null
where worker_id = :worker_id
  and task_id || ' ' || attempt in (
      select json_extract(value, '$.task_id') || ' ' || json_extract(value, '$.attempt')
      from json_each(:held)
  )
