-- Give up missed slots through :slot_ms (the misfire policy), counting them.
update cairnqd_schedules
set last_slot_ms = :slot_ms, misfires = misfires + :skipped, updated_at_ms = :at_ms
where name = :name and last_slot_ms < :slot_ms
returning name
