-- Running tasks a concurrency limit covers whose claim holds no slot of it: a worker
-- that does not know the limit claimed them (a public SDK worker, or a cairnqd worker
-- configured without it), so they run outside the budget. Covered means as in
-- limit_waiting.sql; a cairnqd claim always takes its slot in the claim's transaction.
select t.id, t.queue, t.name, t.worker_id
from cairnq_tasks t
where t.status = 'running'
  and (json_array_length(:queues) = 0 or t.queue in (select value from json_each(:queues)))
  and (json_array_length(:globs) = 0
       or exists (select 1 from json_each(:globs) as g where t.name glob g.value))
  and not exists (
      select 1 from cairnqd_limit_slots s
      where s.limit_name = :limit_name and s.kind = 'concurrency'
        and s.task_id = t.id and s.worker_id = t.worker_id and s.attempt = t.attempt
  )
order by t.updated_at_ms
limit :limit
