-- The fleet-wide features this database uses, and the migration that brought each.
select feature, since
from cairnqd_features
order by feature
