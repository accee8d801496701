-- The cheap probe of wait(): two columns, so a large payload is not read every beat.
select id, status from cairnq_tasks where id = :id
