-- cairnqd_0004 created the dashboard's three indexes on every database. They cost each
-- insert and each change of a task's status (without them submit_many's statement runs
-- 1.15x as fast on SQLite, 1.25x on Postgres: bench/RESULTS.md), so they now exist only
-- where a dashboard is served: protocol/extensions/on_demand/<dialect>/
-- dashboard_indexes.sql, run by the dashboard when it starts. A database with a
-- dashboard gets them back then.
drop index if exists cairnqd_tasks_created_idx;
drop index if exists cairnqd_tasks_status_created_idx;
drop index if exists cairnqd_tasks_run_at_idx;
