-- Purge filtered by one terminal status walks this index in completion order. Its
-- leading column also serves plain status lookups, which is why 0010 can drop the
-- single-column status index.
create index if not exists cairnq_tasks_status_completed_idx
    on cairnq_tasks (status, completed_at_ms);

update cairnq_meta set value = '7' where key = 'schema_version';
