-- First statement of each migration's transaction. EXCLUSIVE conflicts with itself and
-- with writes to the ledger, so concurrent migrators (upstream's and ours) run one file
-- at a time, and a loser re-checks the ledger after the winner commits. Plain reads of
-- the ledger are not blocked.
lock table cairnq_migrations in exclusive mode
