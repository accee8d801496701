-- The graph a task belongs to (inspect --tree, the dashboard's graph): its roots (the
-- ancestors that wait for nothing, or the task itself when it waits for nothing), and
-- every task that descends from one of them, at most :limit, in id order.
with roots as (
    select a.ancestor_id as id
    from cairnqd_task_ancestors a
    where a.task_id = :task_id
      and not exists (select 1 from cairnqd_task_deps d where d.task_id = a.ancestor_id)
    union
    select cast(:task_id as text) as id
    where not exists (select 1 from cairnqd_task_deps d where d.task_id = :task_id)
),
members as (
    select id from roots
    union
    select a.task_id as id
    from cairnqd_task_ancestors a
    join roots r on r.id = a.ancestor_id
)
select t.id, t.name, t.queue, t.status, t.attempt, t.max_attempts, t.run_at_ms,
       t.updated_at_ms
from members m
join cairnq_tasks t on t.id = m.id
order by t.id
limit :limit
