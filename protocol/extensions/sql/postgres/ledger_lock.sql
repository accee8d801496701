-- Serializes cairnqd migrators: EXCLUSIVE conflicts with itself, and a loser re-checks
-- the ledger once the winner has committed.
lock table cairnqd_migrations in exclusive mode
