-- How many tasks match task_ids.sql's filters (all pages): the count a bulk action
-- shows before it asks, and `list`'s "N more" line.
select count(*) as n from cairnq_tasks
where status = any(:statuses::text[])
  and (:queue::text is null or queue = :queue)
  and (:name::text is null or name = :name)
  and (:created_after_ms::bigint is null or created_at_ms >= :created_after_ms)
  and (:created_before_ms::bigint is null or created_at_ms < :created_before_ms)
