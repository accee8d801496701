-- Resolve a business key. Runs after lock_key in the keyed transaction.
select task_id from cairnq_task_keys where key = :key
