-- Give back a slot this claim took a moment ago for a task that then found another of
-- its budgets full: the task is not started, so it holds nothing.
update cairnqd_limit_slots
set until_ms = 0, task_id = null, worker_id = null, attempt = null
where limit_name = :limit_name and part = :part and kind = :kind and slot = :slot
