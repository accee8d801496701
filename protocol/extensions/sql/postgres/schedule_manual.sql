-- `cairnqd schedules run`: record a task enqueued by hand. It claims no slot, so the
-- next slot still fires; a schedule never seen before starts after now.
insert into cairnqd_schedules (
    name, rule, last_slot_ms, last_fired_at_ms, last_task_id, fired_by, updated_at_ms
)
values (:name, :rule, :at_ms, :at_ms, :task_id, :host, :at_ms)
on conflict (name) do update
set last_fired_at_ms = excluded.last_fired_at_ms, last_fired_slot_ms = null,
    last_task_id = excluded.last_task_id, fired_by = excluded.fired_by,
    last_error = null, last_error_at_ms = null, updated_at_ms = excluded.updated_at_ms
