-- Forget daemons that stopped reporting :older_than_ms ago.
delete from cairnqd_daemons
where reported_at_ms < (extract(epoch from now()) * 1000)::bigint - :older_than_ms
returning daemon
