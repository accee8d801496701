-- Task dependencies (docs/dependencies.md): a task submitted `after` others is written
-- queued but due at 253402214400000 (9999-12-31T00:00Z), so no claim of any SDK takes
-- it, and these tables and triggers make it due, in the transaction that settles its
-- last parent, or cancel it when an ancestor fails. Everything here is cairnqd's own,
-- recorded in cairnqd_migrations; the protocol's tables are untouched.

-- One row per edge, in the order the submit named the parents (ctx.dependencies()).
create table if not exists cairnqd_task_deps (
    task_id text not null,
    parent_id text not null,
    position integer not null check (position >= 0),
    primary key (task_id, parent_id)
);
create index if not exists cairnqd_task_deps_parent_idx on cairnqd_task_deps (parent_id);

-- Every ancestor of a task (parents, their parents, ...), written once at submit, so a
-- failed ancestor cancels every waiting descendant with one statement (the same design
-- as on SQLite, whose triggers do not recurse).
create table if not exists cairnqd_task_ancestors (
    task_id text not null,
    ancestor_id text not null,
    primary key (task_id, ancestor_id)
);
create index if not exists cairnqd_task_ancestors_ancestor_idx
    on cairnqd_task_ancestors (ancestor_id);

-- A task held back by its dependencies: while failed_by is null it waits for
-- `remaining` parents to succeed and is then due at greatest(due_ms, that moment);
-- with failed_by set it was canceled because that ancestor failed or was canceled, and
-- a retry of that ancestor brings it back. The row goes once the task is released.
create table if not exists cairnqd_task_waits (
    task_id text primary key,
    remaining integer not null check (remaining >= 0),
    due_ms bigint not null,
    failed_by text
);
create index if not exists cairnqd_task_waits_failed_by_idx
    on cairnqd_task_waits (failed_by) where failed_by is not null;

-- One function for the three status moves that matter. The statements below also fire
-- it for the rows they change (Postgres triggers recurse); each step only touches rows
-- still in the state it expects, so a nested call finds its work done.
create or replace function cairnqd_task_dependencies() returns trigger
language plpgsql
as $$
declare
    released_queue text;
begin
    if new.status = 'succeeded' then
        -- Parents of one fan-in settled at once by several workers lock its wait row in
        -- one order (id), so their transactions queue instead of deadlocking.
        perform 1 from cairnqd_task_waits
        where failed_by is null
          and task_id in (select task_id from cairnqd_task_deps where parent_id = new.id)
        order by task_id
        for update;
        update cairnqd_task_waits
        set remaining = remaining - 1
        where failed_by is null and remaining > 0
          and task_id in (select task_id from cairnqd_task_deps where parent_id = new.id);
        -- The protocol's notify trigger fires on status changes only: wake the workers
        -- of each queue a dependent became due in.
        for released_queue in
            with released as (
                update cairnq_tasks t
                set run_at_ms = greatest(new.updated_at_ms, w.due_ms)
                from cairnqd_task_waits w, cairnqd_task_deps d
                where d.parent_id = new.id and w.task_id = d.task_id
                  and w.remaining = 0 and w.failed_by is null
                  and t.id = w.task_id and t.status = 'queued'
                returning t.queue
            )
            select distinct queue from released
        loop
            perform pg_notify('cairnq_queued', released_queue);
        end loop;
        delete from cairnqd_task_waits
        where remaining = 0 and failed_by is null
          and task_id in (select task_id from cairnqd_task_deps where parent_id = new.id);
    elsif new.status in ('failed', 'canceled') then
        delete from cairnqd_task_waits where task_id = new.id and failed_by is null;
        update cairnqd_task_waits
        set failed_by = new.id
        where failed_by is null
          and task_id in (
            select task_id from cairnqd_task_ancestors where ancestor_id = new.id
          );
        update cairnq_tasks
        set status = 'canceled',
            completed_at_ms = new.updated_at_ms,
            updated_at_ms = new.updated_at_ms,
            error = jsonb_build_object(
                'type', 'DependencyFailed',
                'code', 'dependency_failed',
                'message', 'dependency ' || new.id || ' ' || new.status,
                'retryable', false,
                'details', jsonb_build_object('dependency', new.id, 'status', new.status)
            )
        where status = 'queued'
          and id in (select task_id from cairnqd_task_waits where failed_by = new.id);
    else -- queued again after failed or canceled: a retry
        insert into cairnqd_task_waits (task_id, remaining, due_ms, failed_by)
        select new.id, n, new.run_at_ms, null
        from (
            select count(*)::integer as n from cairnqd_task_deps d
            join cairnq_tasks p on p.id = d.parent_id
            where d.task_id = new.id and p.status <> 'succeeded'
        ) c
        where n > 0
        on conflict (task_id) do update set remaining = excluded.remaining, failed_by = null;
        update cairnq_tasks
        set run_at_ms = 253402214400000
        where id = new.id
          and exists (
            select 1 from cairnqd_task_waits w where w.task_id = new.id and w.failed_by is null
          );
        -- Held by another ancestor that failed on its own: stays canceled, naming it.
        update cairnq_tasks d
        set error = (
            select jsonb_build_object(
                'type', 'DependencyFailed',
                'code', 'dependency_failed',
                'message', 'dependency ' || t.id || ' ' || t.status,
                'retryable', false,
                'details', jsonb_build_object('dependency', t.id, 'status', t.status)
            )
            from cairnqd_task_ancestors a
            join cairnq_tasks t on t.id = a.ancestor_id
            where a.task_id = d.id
              and t.status in ('failed', 'canceled')
              and not exists (
                select 1 from cairnqd_task_waits o
                where o.task_id = t.id and o.failed_by is not null
              )
            order by a.ancestor_id
            limit 1
        )
        where d.status = 'canceled'
          and d.id in (select task_id from cairnqd_task_waits where failed_by = new.id)
          and exists (
            select 1 from cairnqd_task_ancestors a
            join cairnq_tasks t on t.id = a.ancestor_id
            where a.task_id = d.id
              and t.status in ('failed', 'canceled')
              and not exists (
                select 1 from cairnqd_task_waits o
                where o.task_id = t.id and o.failed_by is not null
              )
          );
        update cairnqd_task_waits w
        set failed_by = (
            select a.ancestor_id from cairnqd_task_ancestors a
            join cairnq_tasks t on t.id = a.ancestor_id
            where a.task_id = w.task_id
              and t.status in ('failed', 'canceled')
              and not exists (
                select 1 from cairnqd_task_waits o
                where o.task_id = t.id and o.failed_by is not null
              )
            order by a.ancestor_id
            limit 1
        )
        where w.failed_by = new.id
          and exists (
            select 1 from cairnqd_task_ancestors a
            join cairnq_tasks t on t.id = a.ancestor_id
            where a.task_id = w.task_id
              and t.status in ('failed', 'canceled')
              and not exists (
                select 1 from cairnqd_task_waits o
                where o.task_id = t.id and o.failed_by is not null
              )
          );
        update cairnq_tasks
        set status = 'queued',
            run_at_ms = 253402214400000,
            error = null,
            completed_at_ms = null,
            updated_at_ms = new.updated_at_ms
        where status = 'canceled'
          and id in (select task_id from cairnqd_task_waits where failed_by = new.id);
        update cairnqd_task_waits w
        set failed_by = null,
            remaining = (
                select count(*) from cairnqd_task_deps d
                join cairnq_tasks p on p.id = d.parent_id
                where d.task_id = w.task_id and p.status <> 'succeeded'
            )
        where w.failed_by = new.id;
    end if;
    return null;
end
$$;

-- "update of status" keeps heartbeats and progress writes out; the WHEN keeps claims
-- (queued -> running) and retryable failures (running -> queued) out of plpgsql.
drop trigger if exists cairnqd_tasks_dependencies on cairnq_tasks;
create trigger cairnqd_tasks_dependencies
    after update of status on cairnq_tasks
    for each row
    when (
        old.status is distinct from new.status
        and (
            new.status = 'succeeded'
            or (new.status in ('failed', 'canceled') and old.status in ('queued', 'running'))
            or (new.status = 'queued' and old.status in ('failed', 'canceled'))
        )
    )
    execute function cairnqd_task_dependencies();

-- A deleted task (a purge, a discard) takes its own edges and wait along: one call per
-- statement, reading the deleted rows from the transition table.
create or replace function cairnqd_task_dependencies_deleted() returns trigger
language plpgsql
as $$
begin
    delete from cairnqd_task_waits where task_id in (select id from gone);
    delete from cairnqd_task_deps where task_id in (select id from gone);
    delete from cairnqd_task_ancestors where task_id in (select id from gone);
    return null;
end
$$;

drop trigger if exists cairnqd_tasks_dependencies_deleted on cairnq_tasks;
create trigger cairnqd_tasks_dependencies_deleted
    after delete on cairnq_tasks
    referencing old table as gone
    for each statement
    execute function cairnqd_task_dependencies_deleted();
