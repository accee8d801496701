-- Resolve a business key. Runs inside the keyed transaction (BEGIN IMMEDIATE on SQLite).
select task_id from cairnq_task_keys where key = :key
