-- Backpressure headroom. The inner LIMIT stops the count after max_depth claim-index
-- entries, so a deep backlog costs no more than a full one. Delayed tasks count.
select max(0, :max_depth - (
    select count(*) from (
        select 1 from cairnq_tasks
        where queue = :queue and status = 'queued'
        limit :max_depth
    )
)) as headroom
