-- cairnqd's own index, recorded in cairnqd_migrations (never in upstream's ledger, and
-- it never touches cairnq_meta). Purge deletes tasks and the key table cascades: without
-- an index on task_id, each deleted task scans the whole key table to find its key row.
create index if not exists cairnqd_task_keys_task_id_idx on cairnq_task_keys (task_id);
