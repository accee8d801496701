-- The tasks a submit names in `after` (docs/workflows.md), to check they exist
-- before anything is written. FOR SHARE waits for a parent being settled right now and
-- then holds it until the submit commits: a settle cannot miss the edges this submit
-- writes (its trigger would not see them), nor the submit the parent's new status.
select id, status from cairnq_tasks
where id = any(:ids::text[])
order by id
for share
