-- Close the records of the attempts an operator's stop cut short whose attempt is given
-- back (interruption_give.sql chose them), in release_worker's transaction and before
-- return_unstarted queues their rows again: the attempt did run, so its record stays,
-- named handed_back (operator), and the trigger that forgets the open record of an
-- attempt given back unstarted finds none. :items is a JSON array of {"id": ..., "a":
-- attempt}.
update cairnqd_attempts
set finished_at_ms = :now_ms,
    outcome = 'handed_back',
    detail = 'operator'
where (task_id, attempt) in (
    select json_extract(value, '$.id'), json_extract(value, '$.a') from json_each(:items)
)
  and worker_id = :worker_id
  and finished_at_ms is null
