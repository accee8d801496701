-- Forget daemons stopped or silent for :older_than_ms.
delete from cairnqd_fleet
where seen_at_ms < :now_ms - :older_than_ms
returning daemon
