-- Free the concurrency slots of the tasks a claim's transaction just settled
-- (complete_many's :items, each {id, r, a}): their room is back at once, for the draw
-- that follows. Rate slots are kept: a start stays in its window.
update cairnqd_limit_slots
set until_ms = 0, task_id = null, worker_id = null, attempt = null
where kind = 'concurrency'
  and worker_id = :worker_id
  and task_id || ' ' || attempt in (
      select json_extract(value, '$.id') || ' ' || json_extract(value, '$.a')
      from json_each(:items)
  )
