-- Hold a task that must wait (dependency_wait wrote its row): due at 9999-12-31T00:00Z,
-- which no claim of any SDK reaches, until its last parent succeeds. With :failed_by set an
-- ancestor already failed or was canceled, and the task is canceled at once with the
-- envelope the triggers write for the same case.
update cairnq_tasks
set run_at_ms = 253402214400000,
    status = case when :failed_by is null then status else 'canceled' end,
    completed_at_ms = case when :failed_by is null then completed_at_ms else :now_ms end,
    updated_at_ms = case when :failed_by is null then updated_at_ms else :now_ms end,
    error = case
        when :failed_by is null then error
        else (
            select json_object(
                'type', 'DependencyFailed',
                'code', 'dependency_failed',
                'message', 'dependency ' || f.id || ' ' || f.status,
                'retryable', json('false'),
                'details', json_object('dependency', f.id, 'status', f.status)
            )
            from cairnq_tasks f where f.id = :failed_by
        )
    end
where id = :task_id
returning *
