-- Task dependencies (docs/workflows.md): a task submitted `after` others is written
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
-- `remaining` parents to succeed and is then due at greatest(due_ms, settled_at_ms), the
-- moment the last of them succeeded; with failed_by set it was canceled because that
-- ancestor failed or was canceled, and a retry of that ancestor brings it back. The row
-- goes once the task is released.
create table if not exists cairnqd_task_waits (
    task_id text primary key,
    remaining integer not null check (remaining >= 0),
    due_ms bigint not null,
    failed_by text,
    settled_at_ms bigint
);
create index if not exists cairnqd_task_waits_failed_by_idx
    on cairnqd_task_waits (failed_by) where failed_by is not null;

-- One step of the graph for one task that failed or was canceled (cancel every waiting
-- descendant), or was queued again after either (a retry: wait again, and bring back
-- what it canceled). Successes are counted for a whole statement at once, in
-- cairnqd_task_dependencies below. The statements here change cairnq_tasks and so fire
-- that trigger again for those rows (Postgres triggers recurse); each step only touches
-- rows still in the state it expects, so a nested call finds its work done.
create or replace function cairnqd_task_dependency_step(
    moved_id text, new_status text, moved_at_ms bigint, due_at_ms bigint
) returns void
language plpgsql
as $$
begin
    if new_status in ('failed', 'canceled') then
        delete from cairnqd_task_waits where task_id = moved_id and failed_by is null;
        update cairnqd_task_waits
        set failed_by = moved_id
        where failed_by is null
          and task_id in (
            select task_id from cairnqd_task_ancestors where ancestor_id = moved_id
          );
        update cairnq_tasks
        set status = 'canceled',
            completed_at_ms = moved_at_ms,
            updated_at_ms = moved_at_ms,
            error = jsonb_build_object(
                'type', 'DependencyFailed',
                'code', 'dependency_failed',
                'message', 'dependency ' || moved_id || ' ' || new_status,
                'retryable', false,
                'details', jsonb_build_object('dependency', moved_id, 'status', new_status)
            )
        where status = 'queued'
          and id in (select task_id from cairnqd_task_waits where failed_by = moved_id);
    else -- queued again after failed or canceled: a retry
        insert into cairnqd_task_waits (task_id, remaining, due_ms, failed_by)
        select moved_id, n, due_at_ms, null
        from (
            select count(*)::integer as n from cairnqd_task_deps d
            join cairnq_tasks p on p.id = d.parent_id
            where d.task_id = moved_id and p.status <> 'succeeded'
        ) c
        where n > 0
        on conflict (task_id) do update set remaining = excluded.remaining, failed_by = null;
        update cairnq_tasks
        set run_at_ms = 253402214400000
        where id = moved_id
          and exists (
            select 1 from cairnqd_task_waits w where w.task_id = moved_id and w.failed_by is null
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
          and d.id in (select task_id from cairnqd_task_waits where failed_by = moved_id)
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
        where w.failed_by = moved_id
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
            updated_at_ms = moved_at_ms
        where status = 'canceled'
          and id in (select task_id from cairnqd_task_waits where failed_by = moved_id);
        update cairnqd_task_waits w
        set failed_by = null,
            remaining = (
                select count(*) from cairnqd_task_deps d
                join cairnq_tasks p on p.id = d.parent_id
                where d.task_id = w.task_id and p.status <> 'succeeded'
            )
        where w.failed_by = moved_id;
    end if;
end
$$;

-- One call per statement that updates cairnq_tasks, reading its rows from the
-- transition tables. Each old row is paired with its task by primary key, never with
-- the new rows: the plans are cached for whatever the first statement held, and a
-- nested loop over two transition tables grows with the square of the rows. A settle
-- of tasks without edges costs an index probe of cairnqd_task_deps per row; the parents
-- a statement settled are counted off their dependents' waits together, so a batch of
-- parents of one fan-in is one update of its wait row; a failure, a cancel or a retry
-- of a task with edges runs cairnqd_task_dependency_step. (A trigger with transition
-- tables cannot name columns, so claims, heartbeats and progress writes call it too,
-- and leave at the first test.)
create or replace function cairnqd_task_dependencies() returns trigger
language plpgsql
as $$
declare
    moved record;
    released_queue text;
    -- The dependents of the parents this statement settled, in task id order: how many
    -- of their parents it settled, and when the last of them did.
    hit_ids text[];
    hit_parents integer[];
    hit_settled_at bigint[];
begin
    -- Claims, lease renewals and progress writes leave every row running: no move.
    if not exists (select 1 from cairnqd_dep_new_rows where status <> 'running') then
        return null;
    end if;
    select array_agg(h.task_id order by h.task_id),
           array_agg(h.parents order by h.task_id),
           array_agg(h.settled_at_ms order by h.task_id)
    into hit_ids, hit_parents, hit_settled_at
    from (
        -- Rows without dependents (most of them) drop out at one index probe each.
        with parents as materialized (
            select o.id from cairnqd_dep_old_rows as o
            where o.status <> 'succeeded'
              and exists (select 1 from cairnqd_task_deps as d where d.parent_id = o.id)
        )
        select d.task_id, count(*)::integer as parents, max(t.updated_at_ms) as settled_at_ms
        from parents as p
        cross join lateral (
            -- By primary key, one row each (offset 0 keeps the planner from walking
            -- every succeeded task by the status index instead).
            select x.status, x.updated_at_ms from cairnq_tasks as x where x.id = p.id offset 0
        ) as t
        join cairnqd_task_deps as d on d.parent_id = p.id
        where t.status = 'succeeded'
        group by d.task_id
    ) as h;
    if hit_ids is not null then
        -- Parents of one fan-in settled at once by several workers lock its wait row,
        -- and any others, in one order (task id): their transactions queue instead of
        -- deadlocking.
        perform 1 from cairnqd_task_waits
        where failed_by is null and task_id = any(hit_ids)
        order by task_id
        for update;
        update cairnqd_task_waits as w
        set remaining = greatest(w.remaining - h.parents, 0), settled_at_ms = h.settled_at_ms
        from unnest(hit_ids, hit_parents, hit_settled_at) as h(task_id, parents, settled_at_ms)
        where w.task_id = h.task_id and w.failed_by is null and w.remaining > 0;
        -- The protocol's notify trigger fires on status changes only: wake the workers
        -- of each queue a dependent became due in.
        for released_queue in
            with released as (
                update cairnq_tasks as t
                set run_at_ms = greatest(w.settled_at_ms, w.due_ms)
                from cairnqd_task_waits as w
                where w.task_id = any(hit_ids) and w.remaining = 0 and w.failed_by is null
                  and t.id = w.task_id and t.status = 'queued'
                returning t.queue
            )
            select distinct queue from released
        loop
            perform pg_notify('cairnq_queued', released_queue);
        end loop;
        delete from cairnqd_task_waits
        where task_id = any(hit_ids) and remaining = 0 and failed_by is null;
    end if;
    if not exists (
        select 1 from cairnqd_dep_new_rows where status in ('failed', 'canceled', 'queued')
    ) then
        return null;  -- successes only: counted above
    end if;
    for moved in
        with edged as materialized (
            select o.id, o.status from cairnqd_dep_old_rows as o
            where (
                    exists (select 1 from cairnqd_task_deps as d where d.parent_id = o.id)
                    or exists (select 1 from cairnqd_task_deps as d where d.task_id = o.id)
                )
        )
        select e.id, t.status, t.updated_at_ms, t.run_at_ms
        from edged as e
        cross join lateral (
            select x.status, x.updated_at_ms, x.run_at_ms
            from cairnq_tasks as x where x.id = e.id offset 0
        ) as t
        where (t.status in ('failed', 'canceled') and e.status in ('queued', 'running'))
           or (t.status = 'queued' and e.status in ('failed', 'canceled'))
        order by e.id
    loop
        perform cairnqd_task_dependency_step(
            moved.id, moved.status, moved.updated_at_ms, moved.run_at_ms
        );
    end loop;
    return null;
end
$$;

drop trigger if exists cairnqd_tasks_dependencies on cairnq_tasks;
create trigger cairnqd_tasks_dependencies
    after update on cairnq_tasks
    referencing old table as cairnqd_dep_old_rows new table as cairnqd_dep_new_rows
    for each statement
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
