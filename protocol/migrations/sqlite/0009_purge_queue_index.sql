-- Purge filtered by queue (retention tiers per queue) walks this index in completion
-- order. Partial over terminal rows only, so live traffic never pays for it; purge
-- repeats the same status list verbatim so SQLite recognises the index as usable.
create index if not exists cairnq_tasks_queue_completed_idx
    on cairnq_tasks (queue, completed_at_ms)
    where status in ('succeeded', 'failed', 'canceled');

update cairnq_meta set value = '9' where key = 'schema_version';
