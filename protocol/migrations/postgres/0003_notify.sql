-- Push wake-ups. Workers LISTEN on cairnq_queued (payload: the queue name) and waiters on
-- cairnq_done (payload: the task id). NOTIFY is delivered at commit and duplicates within
-- one transaction collapse, so a batch of inserts into one queue costs one wake.
-- Notifications only accelerate polling. Nothing fires when a delayed task becomes due.
--
-- This migration does not move schema_version.

create or replace function cairnq_notify() returns trigger
language plpgsql
as $$
begin
    -- Work became claimable: a queued insert, or any transition back into queued
    -- (retryable failure, retry, lease recovery). A queued row rewritten as queued is
    -- not news. OLD is only consulted on UPDATE: before Postgres 11 it is unassigned
    -- in an INSERT trigger and reading it raises.
    if tg_op = 'INSERT' then
        if new.status = 'queued' then
            perform pg_notify('cairnq_queued', new.queue);
        end if;
    elsif new.status = 'queued' and old.status <> new.status then
        perform pg_notify('cairnq_queued', new.queue);
    -- A task settled: the first move from a live status into a terminal one.
    elsif new.status in ('succeeded', 'failed', 'canceled')
        and old.status not in ('succeeded', 'failed', 'canceled') then
        perform pg_notify('cairnq_done', new.id);
    end if;
    return null;
end
$$;

-- Recreated rather than "create or replace", which Postgres 13 and older lack for
-- triggers. "update of status" keeps heartbeats and progress writes from firing it, and
-- the WHEN clause keeps claims (the hottest transition, into running) out of plpgsql.
drop trigger if exists cairnq_tasks_notify on cairnq_tasks;

create trigger cairnq_tasks_notify
    after insert or update of status on cairnq_tasks
    for each row
    when (new.status is distinct from 'running')
    execute function cairnq_notify();
