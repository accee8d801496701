-- The rule changed (a reload): the new rule starts after now, so the old rule's
-- missed slots are not caught up under the new one. Returns the row when it changed.
update cairnqd_schedules
set rule = :rule, last_slot_ms = max(last_slot_ms, :at_ms), updated_at_ms = :at_ms
where name = :name and rule <> :rule
returning name
