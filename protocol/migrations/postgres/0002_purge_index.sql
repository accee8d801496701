-- purge deletes terminal rows oldest-completed first. Without this index every purge
-- call scans the whole table to find them.
create index if not exists cairnq_tasks_completed_idx on cairnq_tasks (completed_at_ms);

update cairnq_meta set value = '2' where key = 'schema_version';
