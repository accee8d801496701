-- Drop the overrides of the named limits (a reload of the config that defines them,
-- or `cairnqd limits reset`); the ones dropped.
delete from cairnqd_limit_overrides
where limit_name in (select value from json_each(:names))
returning limit_name
