-- cairnqd_0004 created the dashboard's three indexes on every database. They cost each
-- insert and each change of a task's status (~13% of submit_many's statement on SQLite,
-- ~25% on Postgres, bench/RESULTS.md), so they now exist only where a dashboard is
-- served: protocol/extensions/on_demand/<dialect>/dashboard_indexes.sql, run by the
-- dashboard when it starts. A database with a dashboard gets them back then.
drop index if exists cairnqd_tasks_created_idx;
drop index if exists cairnqd_tasks_status_created_idx;
drop index if exists cairnqd_tasks_run_at_idx;
