-- insert_task for a whole list in one statement (submit_many's keyless runs, and the
-- concurrent submits the coalescer joins). :new_tasks is one JSON array with an object
-- per task, unpacked by json_to_recordset on the server: one text parameter costs the
-- driver far less than a dozen parallel arrays. The keys are short, to keep the text
-- (and its parsing) small:
--   i id, n name, q queue, p payload, m metadata (JSON values, not strings: the server
--   reads them as jsonb once), a max_attempts, r priority, pa parent_id, ro root_id
--   (absent or null: the task's own id), co correlation_id, d delay_ms.
-- Each row gets what insert_task gives it: queued, attempt 0, run_at = now + delay,
-- created = updated = now, one database clock reading for the whole list. That reading
-- is the only thing returned (one row): the client knows every other value it wrote,
-- so a thousand rows never travel back.
with now_ms as (
    select (extract(epoch from clock_timestamp()) * 1000)::bigint as v
),
inserted as (
    insert into cairnq_tasks (
        id, name, queue, status, payload, metadata, max_attempts, priority,
        parent_id, root_id, correlation_id, run_at_ms, created_at_ms, updated_at_ms
    )
    select
        item.i, item.n, item.q, 'queued', item.p, item.m, item.a, item.r,
        item.pa, coalesce(item.ro, item.i), item.co, now_ms.v + item.d, now_ms.v, now_ms.v
    from json_to_recordset(:new_tasks::json) as item (
        i text, n text, q text, p jsonb, m jsonb, a integer, r integer,
        pa text, ro text, co text, d bigint
    )
    cross join now_ms
)
select v as now_ms from now_ms
