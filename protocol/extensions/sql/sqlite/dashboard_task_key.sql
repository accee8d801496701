-- The key a task was submitted with, if any (the dashboard's task page).
select key from cairnq_task_keys where task_id = :id
