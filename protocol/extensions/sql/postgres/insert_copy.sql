-- submit_many's runs of keyless tasks in a long list, streamed (store/postgres/bulk.py). One
-- row per task in COPY's text format, in this column order, each as insert_task makes
-- it: run_at = created + delay, created = updated = the list's one clock reading
-- (clock_ms.sql, read when its transaction began), status 'queued'. The server reads
-- each column straight from the stream, payload and metadata as jsonb text, while the
-- client is still writing the rows that follow.
copy cairnq_tasks (
    id, name, queue, payload, metadata, max_attempts, priority, parent_id, root_id,
    correlation_id, run_at_ms, created_at_ms, updated_at_ms, status
) from stdin
