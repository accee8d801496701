-- The dashboard's search box: among the newest :scan tasks (the inner limit bounds the
-- work whatever is asked: the creation index read from the top), those whose key or
-- name starts with :text, or whose payload holds it (in any case); newest first, at
-- most :limit. The key of each row comes along for the page.
-- dashboard_search_beyond says whether the table holds tasks older than the window.
select t.id, t.name, t.queue, t.status, t.attempt, t.max_attempts, t.priority, t.progress,
       t.worker_id, t.created_at_ms, t.run_at_ms, t.completed_at_ms,
       t.cancel_requested_at_ms, k.key
from (
    select id, name, queue, status, attempt, max_attempts, priority, progress, worker_id,
           created_at_ms, run_at_ms, completed_at_ms, cancel_requested_at_ms, payload
    from cairnq_tasks
    order by created_at_ms desc, id desc
    limit :scan
) as t
left join cairnq_task_keys as k on k.task_id = t.id
where left(k.key, length(:text::text)) = :text::text
   or left(t.name, length(:text::text)) = :text::text
   or strpos(lower(t.payload::text), lower(:text::text)) > 0
order by t.created_at_ms desc, t.id desc
limit :limit
