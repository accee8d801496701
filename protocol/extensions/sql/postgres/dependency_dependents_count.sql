-- How many tasks were submitted `after` a task (the dashboard's count beside the
-- first of them), from the parent index alone.
select count(*) as n from cairnqd_task_deps where parent_id = :task_id
