-- Whether a ledger table exists yet (a database nobody has migrated has none).
select count(*) as n from sqlite_master where type = 'table' and name = :table_name
