-- One page of the ids in a group of the Failed page (task name and error type), in id
-- order after :after_id, for a bulk retry or discard a page per transaction.
select id from cairnq_tasks
where status = 'failed' and name = :name
  and coalesce(json_extract(error, '$.type'), '') = :error_type
  and id > :after_id
order by id
limit :limit
