-- Read-only check before opening a claim transaction: is there due queued work this
-- worker may take, or an expired lease anywhere that the claim would recover? Two
-- separate EXISTS so each arm can use its own index. The lease arm has no queue or name
-- filter (recovery is global). The clock sits in a scalar subselect: evaluated once, it
-- is a constant the planner can use as an index bound, where an inline
-- clock_timestamp() (volatile) would be re-read per row.
select exists (
    select 1 from cairnq_tasks
    where queue = any(:queues::text[])
      and status = 'queued'
      and (:names::text[] is null or name = any(:names::text[]))
      and run_at_ms <= (select (extract(epoch from clock_timestamp()) * 1000)::bigint)
) or exists (
    select 1 from cairnq_tasks
    where status = 'running' and lease_until_ms is not null
      and lease_until_ms <= (select (extract(epoch from clock_timestamp()) * 1000)::bigint)
) as has_work
