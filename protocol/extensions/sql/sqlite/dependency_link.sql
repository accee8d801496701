-- A new task's edges to the parents it waits for, in the order they were named
-- (:parents, a JSON array of ids; position 0 first).
insert into cairnqd_task_deps (task_id, parent_id, position)
select :task_id, value, key from json_each(:parents)
