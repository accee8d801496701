-- The shared ledger, oldest first (`cairnqd migrate` prints it).
select name, applied_at_ms from cairnq_migrations order by applied_at_ms, name
