-- Every limit an operator changed with `cairnqd limits set`, by name.
select limit_name, concurrency, rate_count, rate_window_ms, set_by, set_at_ms, reason
from cairnqd_limit_overrides
order by limit_name
