-- Older writers left a lease on rows they moved out of running. Clear it, so that
-- "lease_until_ms is not null exactly when running" holds for every row and the partial
-- lease index stops carrying dead entries. Only the lease changes: updated_at_ms keeps
-- the time of the real last transition, and the notify trigger (update of status only)
-- stays quiet.
update cairnq_tasks
set lease_until_ms = null
where status <> 'running' and lease_until_ms is not null;

update cairnq_meta set value = '5' where key = 'schema_version';
