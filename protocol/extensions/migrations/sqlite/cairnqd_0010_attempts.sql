-- Attempt history: one row per attempt of a task, opened when the task goes to running
-- and closed when it leaves running, whoever ran it (cairnqd, or a public-SDK worker
-- that only knows the protocol's tables). Triggers on cairnq_tasks keep it: they add
-- nothing to the protocol's schema beyond themselves, and every claim and settlement
-- statement already written, ours or another SDK's, records its attempts unchanged.
--
-- outcome is null while the attempt runs, then one of:
--   succeeded, failed, canceled  the settlement's new status (a pending cancel wins)
--   lease_lost                   recovered after its lease had passed
--   aborted                      the runtime stopped it: detail max_run or stall
--   handed_back                  its worker stopped (detail worker_exit, shutdown, max_run)
-- error is that attempt's own envelope; the task row keeps only the last one.
-- worker_id is the claimer's; the host is read from it (the part before its first ':',
-- as a cairnqd daemon names its workers), so it is not stored.
--
-- One B-tree, keyed by task and attempt (WITHOUT ROWID: a claim adds one entry, not a
-- row and an index entry). started_at_ms completes the key: a retry with its attempts
-- reset runs attempt 1 again. The open record of an attempt is the one with
-- finished_at_ms null. The insert is OR IGNORE: a record that cannot be written is
-- dropped rather than failing the claim that opens it.
create table if not exists cairnqd_attempts (
    task_id text not null,
    attempt integer not null,
    started_at_ms integer not null,
    worker_id text,
    finished_at_ms integer,
    outcome text check (outcome in (
        'succeeded', 'failed', 'canceled', 'lease_lost', 'aborted', 'handed_back'
    )),
    detail text,
    error text,
    primary key (task_id, attempt, started_at_ms)
) without rowid;

-- Row triggers run in-process, and "update of status" with the WHEN clauses keeps
-- heartbeats and progress writes (which never name status) from firing any of them.
create trigger if not exists cairnqd_attempts_open
after update of status on cairnq_tasks
when new.status = 'running' and old.status <> 'running'
begin
    insert or ignore into cairnqd_attempts (task_id, attempt, worker_id, started_at_ms)
    values (new.id, new.attempt, new.worker_id, new.updated_at_ms);
end;

-- Recovery moves a row whose lease had passed (an owned settlement never does). The
-- error's code names an abort (past max_run: the daemon's max_run_exceeded, a worker's
-- handler_timeout) or, written by this statement, a release; a release that leaves an
-- earlier attempt's error is named by the hand-back itself. The code is read only from
-- valid JSON: a row another client wrote with an error that is not must still settle.
create trigger if not exists cairnqd_attempts_close
after update of status on cairnq_tasks
when old.status = 'running' and new.status <> 'running' and new.attempt >= old.attempt
begin
    update cairnqd_attempts
    set finished_at_ms = new.updated_at_ms,
        outcome = case
            when new.status in ('succeeded', 'canceled') then new.status
            when old.lease_until_ms <= new.updated_at_ms then 'lease_lost'
            when json_extract(case when json_valid(new.error) then new.error end, '$.code')
                    in ('max_run_exceeded', 'handler_timeout') then 'aborted'
            when new.error is not old.error
                and json_extract(case when json_valid(new.error) then new.error end, '$.code')
                    = 'lease_expired' then 'handed_back'
            else 'failed'
        end,
        detail = case
            when new.status not in ('succeeded', 'canceled')
                and not (old.lease_until_ms <= new.updated_at_ms)
                and json_extract(case when json_valid(new.error) then new.error end, '$.code')
                    in ('max_run_exceeded', 'handler_timeout') then 'max_run'
        end,
        error = case
            when new.error is not old.error then new.error
            when new.status in ('succeeded', 'canceled') then null
            when old.lease_until_ms <= new.updated_at_ms then null
            else new.error
        end
    where task_id = new.id and attempt = old.attempt and finished_at_ms is null;
end;

-- An attempt given back (return_unstarted) was never started: it leaves no record.
create trigger if not exists cairnqd_attempts_unstarted
after update of status on cairnq_tasks
when old.status = 'running' and new.status <> 'running' and new.attempt < old.attempt
begin
    delete from cairnqd_attempts
    where task_id = new.id and attempt = old.attempt and finished_at_ms is null;
end;

-- A task's attempts go with it, whichever statement deletes it (purge, discard, bulk,
-- another SDK's retention).
create trigger if not exists cairnqd_attempts_forget
after delete on cairnq_tasks
begin
    delete from cairnqd_attempts where task_id = old.id;
end;

-- The triggers record every worker's attempts, but only a daemon that knows the history
-- names why it handed tasks back: under an older one those attempts read as failures.
insert into cairnqd_features (feature, since) values
    ('attempts', 'cairnqd_0010_attempts.sql')
on conflict (feature) do nothing;
