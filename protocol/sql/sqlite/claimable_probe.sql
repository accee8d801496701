-- Read-only check before opening a claim transaction: is there due queued work this
-- worker may take, or an expired lease anywhere that the claim would recover? Two
-- separate EXISTS so each arm can use its own plan. The lease arm has no queue or name
-- filter (recovery is global) and repeats the partial lease index predicate verbatim.
select (
    exists (
        select 1 from cairnq_tasks
        where queue in (select value from json_each(:queues))
          and status = 'queued'
          and (:names is null or name in (select value from json_each(:names)))
          and run_at_ms <= :now_ms
    )
    or exists (
        select 1 from cairnq_tasks
        where status = 'running' and lease_until_ms is not null
          and lease_until_ms <= :now_ms
    )
) as has_work
