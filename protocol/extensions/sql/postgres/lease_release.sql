-- Give the lease :name up at once, if :holder still holds it, so another host may take
-- it on its next try rather than when it expires.
update cairnqd_leases
set expires_at_ms = 0
where name = :name and holder = :holder
