-- The edges among a set of tasks (a graph from dependency_graph): each task with the
-- parents its submit named, in that order.
select d.task_id, d.parent_id, d.position
from cairnqd_task_deps d
where d.task_id in (select value from json_each(:ids))
order by d.task_id, d.position
