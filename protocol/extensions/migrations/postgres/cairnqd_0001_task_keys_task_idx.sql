-- cairnqd's own index, recorded in cairnqd_migrations (never in upstream's ledger, and
-- it never touches cairnq_meta). Purge deletes tasks and the key table cascades: without
-- an index on task_id, each deleted task scans the whole key table to find its key row.
--
-- Built `concurrently`: on a database an SDK has filled for years the key table is large,
-- and a plain build would block every keyed submit while it runs. The runner applies
-- such a migration outside a transaction (cairnqd/store/postgres/migrate.py).
create index concurrently if not exists cairnqd_task_keys_task_id_idx
    on cairnq_task_keys (task_id);
