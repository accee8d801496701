-- recover_leases and the claim probe look for running rows whose lease has passed.
-- Partial, so the index holds only the (few) running rows and costs nothing for the rest.
create index if not exists cairnq_tasks_lease_idx
    on cairnq_tasks (lease_until_ms)
    where status = 'running' and lease_until_ms is not null;

update cairnq_meta set value = '4' where key = 'schema_version';
