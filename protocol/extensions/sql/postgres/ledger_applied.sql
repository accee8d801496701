-- Checked after ledger_lock, so it sees any row committed by the process that held it.
select 1 as applied from cairnqd_migrations where name = :name
