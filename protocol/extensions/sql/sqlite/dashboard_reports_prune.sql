-- Forget daemons that stopped reporting :older_than_ms ago.
delete from cairnqd_daemons where reported_at_ms < :now_ms - :older_than_ms
returning daemon
