-- Recorded in the same transaction as the migration. A duplicate is an error on purpose.
insert into cairnqd_migrations (name, applied_at_ms) values (:name, :now_ms)
