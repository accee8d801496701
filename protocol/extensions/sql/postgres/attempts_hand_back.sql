-- Name the attempts a hand-back closed, in the transaction of its release_worker: the
-- triggers saw a row released under a live lease, not why its worker stopped. :items is
-- a JSON array of {"id": ..., "a": attempt, "s": new status}. A task queued again keeps
-- no error on its record (its row still holds an earlier attempt's); a failed one keeps
-- the release envelope. Canceled attempts keep their outcome; an earlier attempt's
-- max_run error left on the row does not make this one an abort.
update cairnqd_attempts as a
set outcome = :outcome,
    detail = :detail,
    error = case when item.s = 'failed' then a.error end
from json_to_recordset(:items::json) as item (id text, a integer, s text)
where a.task_id = item.id and a.attempt = item.a
  and a.worker_id = :worker_id
  and a.outcome in ('failed', 'lease_lost', 'handed_back', 'aborted')
