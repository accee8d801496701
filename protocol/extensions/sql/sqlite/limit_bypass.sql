-- Running tasks a concurrency limit covers whose worker does not count the limit's
-- running tasks: a worker that does not know the limit claimed them (a public SDK
-- worker, or a cairnqd worker configured without it), so they started outside the
-- budget (though a cairnqd claim counts them against it). Covered means as in
-- limit_waiting.sql; a cairnqd claim under the limit notes its worker
-- (limit_worker_note.sql) in the claim's transaction.
select t.id, t.queue, t.name, t.worker_id
from cairnq_tasks t
where t.status = 'running'
  and (json_array_length(:queues) = 0 or t.queue in (select value from json_each(:queues)))
  and (json_array_length(:globs) = 0
       or exists (select 1 from json_each(:globs) as g where t.name glob g.value))
  and not exists (
      select 1 from cairnqd_limit_workers w
      where w.limit_name = :limit_name and w.worker_id = t.worker_id
  )
order by t.updated_at_ms
limit :limit
