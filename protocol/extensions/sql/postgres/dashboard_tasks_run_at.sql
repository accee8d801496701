-- One page of the dashboard's task list, newest run_at_ms first, after the last row of the
-- previous page (keyset paging: the cursor is that row's (run_at_ms, id), so a page
-- costs the same on page 1 and page 10,000). Every filter is optional. :upper_ms is
-- the lower of the cursor's run_at_ms and the asked range's end, so the index is read
-- from the cursor down, never from the top; the or-term breaks ties on run_at_ms by id.
-- The caller passes the widest range when none is asked.
-- The payload and result are left out: a list never shows them.
select id, name, queue, status, attempt, max_attempts, priority, progress, worker_id,
       created_at_ms, run_at_ms, completed_at_ms, cancel_requested_at_ms
from cairnq_tasks
where (:status::text is null or status = :status)
  and (:queue::text is null or queue = :queue)
  and (:name::text is null or name = :name)
  and (:task_id::text is null or id = :task_id)
  and run_at_ms >= :from_ms::bigint and run_at_ms <= :upper_ms::bigint
  and (run_at_ms < :cursor_ms::bigint or id < :cursor_id::text)
order by run_at_ms desc, id desc
limit :limit
