-- Forget the workers not seen claiming under a limit since :forget_before_ms that run
-- nothing now (a worker with a long task keeps its row while the task runs).
delete from cairnqd_limit_workers
where seen_at_ms < :forget_before_ms
  and not exists (
      select 1 from cairnq_tasks t
      where t.status = 'running' and t.lease_until_ms is not null
        and t.worker_id = cairnqd_limit_workers.worker_id
  )
