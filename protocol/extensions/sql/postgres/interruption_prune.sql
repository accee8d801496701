-- Forget the interruption counts of tasks that ended (or were purged): a count matters
-- only while its task may run again. Run by each hand-back that counts one, so the
-- table holds little more than the live tasks an operator has interrupted.
delete from cairnqd_interruptions
where not exists (
    select 1 from cairnq_tasks as t
    where t.id = cairnqd_interruptions.task_id
      and t.status in ('queued', 'running')
)
