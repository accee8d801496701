-- Whether the table holds more tasks than the search box looks through: a row after
-- the newest :scan (the creation index read from the top, :scan entries skipped).
select id from cairnq_tasks
order by created_at_ms desc, id desc
limit 1 offset :scan
