-- Every filter is optional. The loader rewrites each supplied "(:p is null or col = :p)"
-- to "col = :p" so the planner can reach the matching index. id breaks ties between rows
-- created in the same millisecond, which keeps offset pagination stable.
select * from cairnq_tasks
where (:status is null or status = :status)
  and (:queue is null or queue = :queue)
  and (:name is null or name = :name)
  and (:root_id is null or root_id = :root_id)
  and (:correlation_id is null or correlation_id = :correlation_id)
order by created_at_ms desc, id desc
limit :limit offset :offset
