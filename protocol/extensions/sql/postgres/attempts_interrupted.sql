-- Close the records of the attempts an operator's stop cut short whose attempt is given
-- back (interruption_give.sql chose them), in release_worker's transaction and before
-- return_unstarted queues their rows again: the attempt did run, so its record stays,
-- named handed_back (operator), and the trigger that forgets the open record of an
-- attempt given back unstarted finds none. :items is a JSON array of {"id": ..., "a":
-- attempt}.
update cairnqd_attempts as a
set finished_at_ms = (extract(epoch from now()) * 1000)::bigint,
    outcome = 'handed_back',
    detail = 'operator'
from json_to_recordset(:items::json) as item (id text, a integer)
where a.task_id = item.id and a.attempt = item.a
  and a.worker_id = :worker_id
  and a.finished_at_ms is null
