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
-- No primary key on (task_id, attempt): a retry with its attempts reset runs attempt 1
-- again, and a trigger that raised a unique violation would fail the claim. The open
-- record of an attempt is the one with finished_at_ms null. fillfactor leaves room on
-- each page so closing a record is a HOT update that writes no index entry.
create table if not exists cairnqd_attempts (
    task_id text not null,
    attempt integer not null,
    worker_id text,
    started_at_ms bigint not null,
    finished_at_ms bigint,
    outcome text check (outcome in (
        'succeeded', 'failed', 'canceled', 'lease_lost', 'aborted', 'handed_back'
    )),
    detail text,
    error jsonb
) with (fillfactor = 70);

create index if not exists cairnqd_attempts_task_idx on cairnqd_attempts (task_id, attempt);

-- One call per UPDATE statement on cairnq_tasks (never per row), reading the statement's
-- transition tables. A column list cannot go with transition tables, so heartbeats and
-- progress fire it too: they leave after three short scans, a claim after one scan and
-- one INSERT ... SELECT. Only a statement where a row left running pairs old and new
-- rows, through the primary key of cairnq_tasks (a transition table has no index, and a
-- cached plan of a join between two of them may be a nested loop, quadratic in the rows).
create or replace function cairnqd_attempts_track() returns trigger
language plpgsql
as $$
begin
    if not exists (select 1 from cairnqd_old_rows where status = 'running') then
        -- Nothing was running: every running row now is a new attempt (a claim).
        insert into cairnqd_attempts (task_id, attempt, worker_id, started_at_ms)
        select id, attempt, worker_id, updated_at_ms from cairnqd_new_rows
        where status = 'running';
        return null;
    end if;
    if exists (select 1 from cairnqd_new_rows where status <> 'running') then
        -- A row left running: close its attempt. Recovery moves a row whose lease had passed
        -- (an owned settlement never does). The error's code names an abort (past max_run:
        -- the daemon's max_run_exceeded, a worker's handler_timeout) or, written by this
        -- statement, a release; a release that leaves an earlier attempt's error is named
        -- by the hand-back itself. An attempt given back (return_unstarted) was never
        -- started and leaves no record.
        with pair as materialized (
            select o.id, o.attempt as old_attempt, t.attempt, t.updated_at_ms as now_ms,
                   k.outcome,
                   case
                       when k.outcome in ('failed', 'aborted', 'handed_back') or k.written
                           then t.error
                   end as error,
                   case when k.outcome = 'aborted' then 'max_run' end as detail
            from cairnqd_old_rows as o
            join cairnq_tasks as t on t.id = o.id
            cross join lateral (
                select t.error is distinct from o.error as written,
                       case
                           when t.status in ('succeeded', 'canceled') then t.status
                           when o.lease_until_ms <= t.updated_at_ms then 'lease_lost'
                           when t.error ->> 'code' in ('max_run_exceeded', 'handler_timeout')
                               then 'aborted'
                           when t.error is distinct from o.error
                               and t.error ->> 'code' = 'lease_expired' then 'handed_back'
                           else 'failed'
                       end as outcome
            ) as k
            where o.status = 'running' and t.status <> 'running'
        ),
        unstarted as (
            delete from cairnqd_attempts as a
            using pair as p
            where p.attempt < p.old_attempt
              and a.task_id = p.id and a.attempt = p.old_attempt and a.finished_at_ms is null
        )
        update cairnqd_attempts as a
        set finished_at_ms = p.now_ms, outcome = p.outcome, detail = p.detail, error = p.error
        from pair as p
        where p.attempt >= p.old_attempt
          and a.task_id = p.id and a.attempt = p.old_attempt and a.finished_at_ms is null;
    end if;
    if exists (select 1 from cairnqd_old_rows where status <> 'running')
        and exists (select 1 from cairnqd_new_rows where status = 'running') then
        -- Some rows ran already and others went to running (no protocol statement
        -- does both; a hand-written UPDATE might): open what has no open record.
        insert into cairnqd_attempts (task_id, attempt, worker_id, started_at_ms)
        select n.id, n.attempt, n.worker_id, n.updated_at_ms
        from cairnqd_new_rows as n
        where n.status = 'running'
          and not exists (
              select 1 from cairnqd_attempts as a
              where a.task_id = n.id and a.attempt = n.attempt and a.finished_at_ms is null
          );
    end if;
    return null;
end
$$;

-- A task's attempts go with it, whichever statement deletes it (purge, discard, bulk,
-- another SDK's retention): one DELETE per statement, probing the index per task.
create or replace function cairnqd_attempts_forget() returns trigger
language plpgsql
as $$
begin
    delete from cairnqd_attempts where task_id in (select id from cairnqd_gone_rows);
    return null;
end
$$;

drop trigger if exists cairnqd_attempts_track on cairnq_tasks;
create trigger cairnqd_attempts_track
    after update on cairnq_tasks
    referencing old table as cairnqd_old_rows new table as cairnqd_new_rows
    for each statement
    execute function cairnqd_attempts_track();

drop trigger if exists cairnqd_attempts_forget on cairnq_tasks;
create trigger cairnqd_attempts_forget
    after delete on cairnq_tasks
    referencing old table as cairnqd_gone_rows
    for each statement
    execute function cairnqd_attempts_forget();

-- The triggers record every worker's attempts, but only a daemon that knows the history
-- names why it handed tasks back: under an older one those attempts read as failures.
insert into cairnqd_features (feature, since) values
    ('attempts', 'cairnqd_0010_attempts.sql')
on conflict (feature) do nothing;
