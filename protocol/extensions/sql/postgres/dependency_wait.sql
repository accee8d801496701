-- Whether a new task must wait: `remaining` counts its parents that have not succeeded,
-- `failed_by` names an ancestor that failed or was canceled on its own (not one
-- canceled for another ancestor). A task with neither gets no row and stays due as
-- submitted. The row returned tells the store to hold the task (dependency_hold).
insert into cairnqd_task_waits (task_id, remaining, due_ms, failed_by)
select task_id, remaining, due_ms, failed_by
from (
    select t.id as task_id,
        (
            select count(*)::integer from cairnqd_task_deps d
            join cairnq_tasks p on p.id = d.parent_id
            where d.task_id = t.id and p.status <> 'succeeded'
        ) as remaining,
        t.run_at_ms as due_ms,
        (
            select a.ancestor_id from cairnqd_task_ancestors a
            join cairnq_tasks x on x.id = a.ancestor_id
            where a.task_id = t.id
              and x.status in ('failed', 'canceled')
              and not exists (
                select 1 from cairnqd_task_waits o
                where o.task_id = x.id and o.failed_by is not null
              )
            order by a.ancestor_id
            limit 1
        ) as failed_by
    from cairnq_tasks t
    where t.id = :task_id
) as candidate
where remaining > 0 or failed_by is not null
returning remaining, failed_by
