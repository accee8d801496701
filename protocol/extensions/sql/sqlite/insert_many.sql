-- insert_task for a whole list of tasks (submit_many's keyless runs, and concurrent
-- submits sharing a statement). A row statement: the store repeats the parenthesized
-- row after `values` once per task (cairnqd/store/sqlite/statements.py, `run_rows`)
-- and binds every task's values in this order: id, name, queue, payload, metadata,
-- max_attempts, priority, parent_id, root_id, correlation_id, run_at_ms,
-- created_at_ms, updated_at_ms. Plain bound values, not one JSON document unpacked by
-- json_each: SQLite then has nothing to parse (about 20% less per row,
-- bench/insert_sql.py). The store computes the times itself (run_at = now + delay,
-- created = updated = now, as insert_task has them), so nothing needs to come back.
insert into cairnq_tasks (
    id, name, queue, status, payload, metadata, max_attempts, priority,
    parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
) values
    (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
