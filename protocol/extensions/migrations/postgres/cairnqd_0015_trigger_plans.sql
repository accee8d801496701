-- The statement-level triggers that cairnqd_0010_attempts.sql and
-- cairnqd_0013_dependencies.sql put on cairnq_tasks look up a handful of rows of a table
-- that only grows (attempt records, dependency edges) for the rows one statement moved.
-- PL/pgSQL keeps each plan for the life of the connection, and one made while such a
-- table was small (a new database, before autovacuum first analyzes it) reads the whole
-- table on every call: a drain of 20,000 tasks made each settle of 32 tasks cost 2.7 ms
-- at its start and 6.3 ms at its end. Those plans are never right for a table of any size
-- (the rows looked up always come by an index), so the functions plan without
-- sequential scans of tables; the transition tables they read are not affected.
-- Postgres only: SQLite plans each trigger statement afresh, by its indexes.
-- cairnqd's own functions, recorded in cairnqd_migrations.
alter function cairnqd_attempts_track() set enable_seqscan = off;
alter function cairnqd_attempts_forget() set enable_seqscan = off;
alter function cairnqd_task_dependencies() set enable_seqscan = off;
alter function cairnqd_task_dependency_step(text, text, bigint, bigint) set enable_seqscan = off;
alter function cairnqd_task_dependencies_deleted() set enable_seqscan = off;
