-- Every name in the shared ledger (used to tell which migrations are pending).
select name from cairnq_migrations
