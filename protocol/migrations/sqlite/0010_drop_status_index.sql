-- The single-column status index is covered by the leading column of
-- cairnq_tasks_status_completed_idx and was maintained on every status transition.
drop index if exists cairnq_tasks_status_idx;

update cairnq_meta set value = '10' where key = 'schema_version';
