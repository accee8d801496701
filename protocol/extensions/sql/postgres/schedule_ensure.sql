-- A schedule seen for the first time starts after now: no backfill of its history.
insert into cairnqd_schedules (name, rule, last_slot_ms, updated_at_ms)
values (:name, :rule, :at_ms, :at_ms)
on conflict (name) do nothing
