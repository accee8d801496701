-- How many tasks match task_ids.sql's filters (all pages): the count a bulk action
-- shows before it asks, and `list`'s "N more" line.
select count(*) as n from cairnq_tasks
where status in (select value from json_each(:statuses))
  and (:queue is null or queue = :queue)
  and (:name is null or name = :name)
  and (:created_after_ms is null or created_at_ms >= :created_after_ms)
  and (:created_before_ms is null or created_at_ms < :created_before_ms)
