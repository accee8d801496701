-- Claim one slot: move last_slot_ms up to it, only if no one has yet. No row back:
-- another host (or an earlier run of this one) already dealt with this slot.
update cairnqd_schedules
set last_slot_ms = :slot_ms, updated_at_ms = :at_ms
where name = :name and last_slot_ms < :slot_ms
returning name
