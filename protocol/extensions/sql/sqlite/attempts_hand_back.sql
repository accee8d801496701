-- Name the attempts a hand-back closed, in the transaction of its release_worker: the
-- triggers saw a row released under a live lease, not why its worker stopped. :items is
-- a JSON array of {"id": ..., "a": attempt, "s": new status}. A task queued again keeps
-- no error on its record (its row still holds an earlier attempt's); a failed one keeps
-- the release envelope. Canceled attempts keep their outcome; an earlier attempt's
-- max_run error left on the row does not make this one an abort.
update cairnqd_attempts
set outcome = :outcome,
    detail = :detail,
    error = case
        when (task_id, attempt, 'failed') in (
            select json_extract(value, '$.id'), json_extract(value, '$.a'),
                   json_extract(value, '$.s')
            from json_each(:items)
        ) then error
    end
where (task_id, attempt) in (
    select json_extract(value, '$.id'), json_extract(value, '$.a') from json_each(:items)
)
  and worker_id = :worker_id
  and outcome in ('failed', 'lease_lost', 'handed_back', 'aborted')
