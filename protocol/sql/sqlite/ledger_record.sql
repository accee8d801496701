-- Recorded in the same transaction as the migration itself. A duplicate name is an
-- error on purpose: it would mean the lock did not serialize the migrators.
insert into cairnq_migrations (name, applied_at_ms) values (:name, :now_ms)
