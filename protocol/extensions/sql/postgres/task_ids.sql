-- The ids a bulk cancel or retry acts on (`cairnqd cancel --queue Q ...`), one page at
-- a time in id order after :after_id (keyset paging), so each page is changed in one
-- short transaction by the canonical cancel or retry statement, row by row.
-- --since and --older-than compare the creation time.
select id from cairnq_tasks
where status = any(:statuses::text[])
  and (:queue::text is null or queue = :queue)
  and (:name::text is null or name = :name)
  and (:created_after_ms::bigint is null or created_at_ms >= :created_after_ms)
  and (:created_before_ms::bigint is null or created_at_ms < :created_before_ms)
  and id > :after_id
order by id
limit :limit
