-- After a purge sweep that deleted rows: whether cairnq_tasks needs a VACUUM that
-- autovacuum will not run, because it is off for the server or for this table. Without
-- one, nothing reclaims the row versions that claims, completions and the purge leave
-- behind, and every claim walks their index entries at the head of the queued range:
-- the claim's cost grows with every task run since the table was last vacuumed.
-- Due when the dead rows pass autovacuum's own default threshold (50 + 20% of the
-- live rows), so a busy table is vacuumed about as often as autovacuum would.
select (
        not current_setting('autovacuum')::boolean
        or exists (
            select 1 from pg_options_to_table(c.reloptions) as o
            where o.option_name = 'autovacuum_enabled' and not o.option_value::boolean
        )
    )
    and s.n_dead_tup > 50 + 0.2 * s.n_live_tup as due,
    s.n_dead_tup as dead_rows
from pg_class as c
join pg_stat_all_tables as s on s.relid = c.oid
where c.oid = 'cairnq_tasks'::regclass
