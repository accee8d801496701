-- Every name in our extension ledger (used to tell which migrations are pending).
select name from cairnqd_migrations
