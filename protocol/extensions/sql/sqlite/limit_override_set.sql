-- Set (or replace) the operator's override of one limit; the values not given keep
-- the config's.
insert into cairnqd_limit_overrides
    (limit_name, concurrency, rate_count, rate_window_ms, set_by, set_at_ms, reason)
values (:limit_name, :concurrency, :rate_count, :rate_window_ms, :set_by, :now_ms, :reason)
on conflict (limit_name) do update
set concurrency = excluded.concurrency,
    rate_count = excluded.rate_count,
    rate_window_ms = excluded.rate_window_ms,
    set_by = excluded.set_by,
    set_at_ms = excluded.set_at_ms,
    reason = excluded.reason
returning *
