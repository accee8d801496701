-- Per-name claim draws (name = :name) get their own ordered index, so they read only
-- the matching rows in claim order instead of filtering the whole queue.
-- 0008 replaces this definition with one ordered by run_at_ms, id.
create index if not exists cairnq_tasks_claim_name_idx
    on cairnq_tasks (queue, status, name, priority desc, created_at_ms);

update cairnq_meta set value = '6' where key = 'schema_version';
