-- What the slot claimed by schedule_advance enqueued, in the same transaction.
update cairnqd_schedules
set last_fired_at_ms = :at_ms, last_fired_slot_ms = :slot_ms, last_task_id = :task_id,
    fired_by = :host, last_error = null, last_error_at_ms = null, updated_at_ms = :at_ms
where name = :name
