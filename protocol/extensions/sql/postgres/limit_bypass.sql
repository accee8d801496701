-- Running tasks a concurrency limit covers whose claim holds no slot of it: a worker
-- that does not know the limit claimed them (a public SDK worker, or a cairnqd worker
-- configured without it), so they run outside the budget. Covered means as in
-- limit_waiting.sql; a cairnqd claim always takes its slot in the claim's transaction.
select t.id, t.queue, t.name, t.worker_id
from cairnq_tasks t
where t.status = 'running'
  and (cardinality(:queues::text[]) = 0 or t.queue = any(:queues::text[]))
  and (cardinality(:globs::text[]) = 0 or t.name like any(:globs::text[]))
  and not exists (
      select 1 from cairnqd_limit_slots s
      where s.limit_name = :limit_name and s.kind = 'concurrency'
        and s.task_id = t.id and s.worker_id = t.worker_id and s.attempt = t.attempt
  )
order by t.updated_at_ms
limit :limit
