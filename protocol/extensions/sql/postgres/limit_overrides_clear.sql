-- Drop the overrides of the named limits (a reload of the config that defines them,
-- or `cairnqd limits reset`); the ones dropped.
delete from cairnqd_limit_overrides
where limit_name = any(:names::text[])
returning limit_name
