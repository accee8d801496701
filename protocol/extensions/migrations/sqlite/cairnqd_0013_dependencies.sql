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

-- Every ancestor of a task (parents, their parents, ...), written once at submit: a
-- failed ancestor cancels every waiting descendant with one statement, since a SQLite
-- trigger does not fire again while it runs (recursive_triggers is off by default).
create table if not exists cairnqd_task_ancestors (
    task_id text not null,
    ancestor_id text not null,
    primary key (task_id, ancestor_id)
);
create index if not exists cairnqd_task_ancestors_ancestor_idx
    on cairnqd_task_ancestors (ancestor_id);

-- A task held back by its dependencies: while failed_by is null it waits for
-- `remaining` parents to succeed and is then due at max(due_ms, settled_at_ms), the
-- moment the last of them succeeded; with failed_by set it was canceled because that
-- ancestor failed or was canceled, and a retry of that ancestor brings it back. The row
-- goes once the task is released.
create table if not exists cairnqd_task_waits (
    task_id text primary key,
    remaining integer not null check (remaining >= 0),
    due_ms integer not null,
    failed_by text,
    settled_at_ms integer
);
create index if not exists cairnqd_task_waits_failed_by_idx
    on cairnqd_task_waits (failed_by) where failed_by is not null;

-- What a settle costs. SQLite runs the program of every trigger on cairnq_tasks status
-- changes for every updated row, and a program that writes cairnq_tasks carries the
-- programs of every status trigger with it. So the triggers on cairnq_tasks below only
-- write cairnqd's own tables, and only for tasks with edges (a probe of an index of
-- cairnqd_task_deps decides): a settle of a task without edges costs one or two probes.
-- The writes back into cairnq_tasks live in the triggers on cairnqd_task_waits and
-- cairnqd_task_dep_moves, which run only for tasks with edges.

-- A parent succeeded: each waiting dependent has one parent less to wait for. The
-- common case, a parent of a wide fan-in that is not the last, costs one update.
create trigger if not exists cairnqd_tasks_dependency_succeeded
after update of status on cairnq_tasks
when new.status = 'succeeded' and old.status <> 'succeeded'
    and exists (select 1 from cairnqd_task_deps where parent_id = new.id)
begin
    update cairnqd_task_waits
    set remaining = remaining - 1, settled_at_ms = new.updated_at_ms
    where failed_by is null and remaining > 0
      and task_id in (select task_id from cairnqd_task_deps where parent_id = new.id);
end;

-- A dependent with no parent left to wait for is released: due at the later of the
-- time its submit asked for and the moment its last parent succeeded.
create trigger if not exists cairnqd_task_waits_released
after update of remaining on cairnqd_task_waits
when new.remaining = 0 and new.failed_by is null
begin
    update cairnq_tasks
    set run_at_ms = max(coalesce(new.settled_at_ms, new.due_ms), new.due_ms)
    where id = new.task_id and +status = 'queued';
    delete from cairnqd_task_waits where task_id = new.task_id;
end;

-- A failure, a cancel or a retry of a task with edges, handed from the trigger on
-- cairnq_tasks to the triggers on this table, which do the work and delete the row
-- again: the table is empty outside a statement.
create table if not exists cairnqd_task_dep_moves (
    task_id text not null,
    new_status text not null,
    updated_at_ms integer not null,
    run_at_ms integer not null
);

-- The moves that matter besides a success: a task failing or canceled while it waits
-- or runs, and a retry of a failed or canceled task. Claims (queued -> running) and
-- retryable failures (running -> queued) fail the first test; tasks without edges, the
-- second.
create trigger if not exists cairnqd_tasks_dependency_moved
after update of status on cairnq_tasks
when (
        (new.status in ('failed', 'canceled') and old.status in ('queued', 'running'))
        or (new.status = 'queued' and old.status in ('failed', 'canceled'))
    )
    and (
        exists (select 1 from cairnqd_task_deps where parent_id = new.id)
        or exists (select 1 from cairnqd_task_deps where task_id = new.id)
    )
begin
    insert into cairnqd_task_dep_moves (task_id, new_status, updated_at_ms, run_at_ms)
    values (new.id, new.status, new.updated_at_ms, new.run_at_ms);
end;

-- A task failed or was canceled: it stops waiting itself, and every waiting descendant
-- is canceled with the dependency_failed envelope naming it.
create trigger if not exists cairnqd_task_dep_moves_failed
after insert on cairnqd_task_dep_moves
when new.new_status in ('failed', 'canceled')
begin
    delete from cairnqd_task_waits where task_id = new.task_id and failed_by is null;
    update cairnqd_task_waits
    set failed_by = new.task_id
    where failed_by is null
      and task_id in (
        select task_id from cairnqd_task_ancestors where ancestor_id = new.task_id
      );
    update cairnq_tasks
    set status = 'canceled',
        completed_at_ms = new.updated_at_ms,
        updated_at_ms = new.updated_at_ms,
        error = json_object(
            'type', 'DependencyFailed',
            'code', 'dependency_failed',
            'message', 'dependency ' || new.task_id || ' ' || new.new_status,
            'retryable', json('false'),
            'details', json_object('dependency', new.task_id, 'status', new.new_status)
        )
    where +status = 'queued'
      and id in (select task_id from cairnqd_task_waits where failed_by = new.task_id);
    delete from cairnqd_task_dep_moves where rowid = new.rowid;
end;

-- A failed or canceled task is queued again (a retry). If some parent of its own has
-- not succeeded it waits again; the dependents it canceled wait again too, unless
-- another ancestor that failed on its own still holds them: they are then its, and
-- their error names it instead.
create trigger if not exists cairnqd_task_dep_moves_retried
after insert on cairnqd_task_dep_moves
when new.new_status = 'queued'
begin
    insert into cairnqd_task_waits (task_id, remaining, due_ms, failed_by)
    select new.task_id, n, new.run_at_ms, null
    from (
        select count(*) as n from cairnqd_task_deps d
        join cairnq_tasks p on p.id = d.parent_id
        where d.task_id = new.task_id and p.status <> 'succeeded'
    )
    where n > 0
    on conflict (task_id) do update set remaining = excluded.remaining, failed_by = null;
    update cairnq_tasks
    set run_at_ms = 253402214400000
    where id = new.task_id
      and exists (
        select 1 from cairnqd_task_waits w where w.task_id = new.task_id and w.failed_by is null
      );
    update cairnq_tasks
    set error = (
        select json_object(
            'type', 'DependencyFailed',
            'code', 'dependency_failed',
            'message', 'dependency ' || t.id || ' ' || t.status,
            'retryable', json('false'),
            'details', json_object('dependency', t.id, 'status', t.status)
        )
        from cairnqd_task_ancestors a
        join cairnq_tasks t on t.id = a.ancestor_id
        where a.task_id = cairnq_tasks.id
          and t.status in ('failed', 'canceled')
          and not exists (
            select 1 from cairnqd_task_waits o
            where o.task_id = t.id and o.failed_by is not null
          )
        order by a.ancestor_id
        limit 1
    )
    where +status = 'canceled'
      and id in (select task_id from cairnqd_task_waits where failed_by = new.task_id)
      and exists (
        select 1 from cairnqd_task_ancestors a
        join cairnq_tasks t on t.id = a.ancestor_id
        where a.task_id = cairnq_tasks.id
          and t.status in ('failed', 'canceled')
          and not exists (
            select 1 from cairnqd_task_waits o
            where o.task_id = t.id and o.failed_by is not null
          )
      );
    update cairnqd_task_waits
    set failed_by = (
        select a.ancestor_id from cairnqd_task_ancestors a
        join cairnq_tasks t on t.id = a.ancestor_id
        where a.task_id = cairnqd_task_waits.task_id
          and t.status in ('failed', 'canceled')
          and not exists (
            select 1 from cairnqd_task_waits o
            where o.task_id = t.id and o.failed_by is not null
          )
        order by a.ancestor_id
        limit 1
    )
    where failed_by = new.task_id
      and exists (
        select 1 from cairnqd_task_ancestors a
        join cairnq_tasks t on t.id = a.ancestor_id
        where a.task_id = cairnqd_task_waits.task_id
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
    where +status = 'canceled'
      and id in (select task_id from cairnqd_task_waits where failed_by = new.task_id);
    update cairnqd_task_waits
    set failed_by = null,
        remaining = (
            select count(*) from cairnqd_task_deps d
            join cairnq_tasks p on p.id = d.parent_id
            where d.task_id = cairnqd_task_waits.task_id and p.status <> 'succeeded'
        )
    where failed_by = new.task_id;
    delete from cairnqd_task_dep_moves where rowid = new.rowid;
end;

-- A deleted task (a purge, a discard) takes its own edges and wait along.
create trigger if not exists cairnqd_tasks_dependency_deleted
after delete on cairnq_tasks
when exists (select 1 from cairnqd_task_deps where task_id = old.id)
begin
    delete from cairnqd_task_waits where task_id = old.id;
    delete from cairnqd_task_deps where task_id = old.id;
    delete from cairnqd_task_ancestors where task_id = old.id;
end;
