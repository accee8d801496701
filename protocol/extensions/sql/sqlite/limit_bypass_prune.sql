-- Forget the claims past limits last seen before :forget_before_ms (an hour ago).
delete from cairnqd_limit_bypasses
where seen_at_ms < :forget_before_ms
