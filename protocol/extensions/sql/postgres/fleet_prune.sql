-- Forget daemons stopped or silent for :older_than_ms.
delete from cairnqd_fleet
where seen_at_ms < (extract(epoch from now()) * 1000)::bigint - :older_than_ms
returning daemon
