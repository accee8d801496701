-- Our extension ledger, oldest first (`cairnqd migrate` prints it).
select name, applied_at_ms from cairnqd_migrations order by applied_at_ms, name
