-- The database clock in epoch milliseconds, as insert_task reads it: what a streamed
-- submit_many (insert_copy.sql) stamps every task of its list with.
select (extract(epoch from clock_timestamp()) * 1000)::bigint as now_ms
