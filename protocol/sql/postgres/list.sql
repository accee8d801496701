-- Every filter is optional. The loader rewrites each supplied filter to "col = :p" so the
-- planner can reach the matching index. id breaks ties between rows created in the same
-- millisecond, which keeps offset pagination stable.
-- The ::text on the first use types the parameter: an absent filter is bound as NULL,
-- and Postgres cannot infer a type from "is null" (it rejects the statement).
select * from cairnq_tasks
where (:status::text is null or status = :status)
  and (:queue::text is null or queue = :queue)
  and (:name::text is null or name = :name)
  and (:root_id::text is null or root_id = :root_id)
  and (:correlation_id::text is null or correlation_id = :correlation_id)
order by created_at_ms desc, id desc
limit :limit offset :offset
