-- Pause one queue (`cairnqd pause`). A queue already paused keeps its first pause
-- (who and when): no row comes back, and the caller says it was paused already.
insert into cairnqd_queue_pauses (queue, paused_at_ms, paused_by, reason)
values (:queue, :now_ms, :paused_by, :reason)
on conflict (queue) do nothing
returning queue, paused_at_ms, paused_by, reason
