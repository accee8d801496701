-- Schema guard: one row per schema holding a cairnq_tasks table, looked up in the
-- catalog rather than through search_path (create table if not exists would otherwise
-- quietly build a second, empty installation). The left join from a one-row relation
-- always yields at least one row, with schema null when nothing is installed. Scalar
-- text columns only: an array of name values is decoded differently by each driver.
select current_schema()::text as current_schema,
       n.nspname::text as schema
from (select 1) as one
left join (
    pg_catalog.pg_class as c
    join pg_catalog.pg_namespace as n on n.oid = c.relnamespace
) on c.relname = 'cairnq_tasks' and c.relkind = 'r'
order by schema
