-- After a purge sweep that deleted rows: copy what the WAL holds back into the database
-- file so the WAL stops growing. PASSIVE never waits for readers or writers (it does what
-- it can now), so workers are not stalled; freed pages are reused, so no VACUUM.
pragma wal_checkpoint(PASSIVE)
