-- The dashboard's indexes: its task list pages newest first by creation or due time,
-- keyset style ("(sort column, id) below the last row seen"), and these give each sort
-- its order, so a page reads its rows from an index instead of sorting the table
-- (1,000,000 rows: milliseconds, not seconds). A status filter, the most common one,
-- has its own index for the creation order; finish order already has the protocol's
-- (status, completed_at_ms).
--
-- Not a migration: every index costs each insert and each change of status, so only a
-- database a dashboard reads should pay for them. A daemon or `cairnqd dashboard` that
-- serves pages runs this file when it starts (one statement at a time); migration
-- cairnqd_0006 drops them from databases where cairnqd_0004 made them unconditionally.
create index if not exists cairnqd_tasks_created_idx on cairnq_tasks (created_at_ms, id);
create index if not exists cairnqd_tasks_status_created_idx
    on cairnq_tasks (status, created_at_ms, id);
create index if not exists cairnqd_tasks_run_at_idx on cairnq_tasks (run_at_ms, id);
