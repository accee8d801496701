-- Every daemon's last report, with its age on the database's clock (the Workers page).
select daemon, host, snapshot, reported_at_ms, :now_ms - reported_at_ms as age_ms
from cairnqd_daemons
order by host, daemon
