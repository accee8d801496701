-- Every schedule's state, with the status of the task it enqueued last.
select s.name, s.rule, s.last_slot_ms, s.last_fired_at_ms, s.last_fired_slot_ms,
    s.last_task_id, t.status as last_status, s.fired_by, s.last_error, s.last_error_at_ms,
    s.misfires, s.leader, s.leader_seen_at_ms
from cairnqd_schedules s
left join cairnq_tasks t on t.id = s.last_task_id
order by s.name
