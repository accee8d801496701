-- The tasks a submit names in `after` (docs/workflows.md), to check they exist
-- before anything is written. SQLite runs it inside the submit's BEGIN IMMEDIATE, so
-- no parent can settle between this read and the edges written after it.
select id, status from cairnq_tasks
where id in (select value from json_each(:ids))
