-- Whether a ledger table exists yet in the current schema (a database nobody has
-- migrated has none).
select count(*) as n from pg_catalog.pg_tables
where schemaname = current_schema() and tablename = :table_name
