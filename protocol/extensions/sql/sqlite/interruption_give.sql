-- Count an operator's interruption against each task of :interrupted (a JSON array of
-- {"id": ..., "a": attempt}) that worker :worker_id still runs at that attempt with no
-- cancel pending, as long as the task has had fewer than :cap: the ids returned may
-- have their attempt given back (return_unstarted does it next, in the same
-- transaction). A task at its cap is not returned and its count stays.
insert into cairnqd_interruptions (task_id, given, updated_at_ms)
select t.id, 1, :now_ms
from cairnq_tasks as t
where t.status = 'running' and t.lease_until_ms is not null
  and t.worker_id = :worker_id
  and t.cancel_requested_at_ms is null
  and exists (
    select 1 from json_each(:interrupted) as u
    where json_extract(u.value, '$.id') = t.id
      and json_extract(u.value, '$.a') = t.attempt
  )
on conflict (task_id) do update
set given = cairnqd_interruptions.given + 1,
    updated_at_ms = excluded.updated_at_ms
where cairnqd_interruptions.given < :cap
returning task_id
