-- Delete one failed task (the Failed page's discard); a task retried meanwhile is no
-- longer failed and stays. Its key row cascades.
delete from cairnq_tasks where id = :id and status = 'failed'
returning id
