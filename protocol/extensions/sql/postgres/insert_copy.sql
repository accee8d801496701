-- submit_many's keyless chunks after the first, streamed (store/pg_bulk.py). One row
-- per task, in this column order (SQLite's insert_many row, then the status), each as
-- insert_task makes it: run_at = created + delay, created = updated = the clock
-- reading the list's first chunk (an insert_many) returned, status 'queued'. No JSON
-- document to unpack: the server reads each column straight from the stream, payload
-- and metadata as jsonb text.
copy cairnq_tasks (
    id, name, queue, payload, metadata, max_attempts, priority, parent_id, root_id,
    correlation_id, run_at_ms, created_at_ms, updated_at_ms, status
) from stdin
