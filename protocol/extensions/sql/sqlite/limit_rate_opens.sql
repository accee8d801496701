-- When the next slot of a full rate budget frees: the earliest end of a start's
-- window among its slots below capacity. A worker waiting for room sleeps until then.
select min(until_ms) as opens_at_ms
from cairnqd_limit_slots
where limit_name = :limit_name and part = :part and kind = 'rate' and slot < :capacity
