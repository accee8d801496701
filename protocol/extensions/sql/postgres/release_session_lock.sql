-- Release a lock taken by try_session_lock on the same session. Closing the session
-- releases it too; this frees it at once for a session that stays open.
select pg_advisory_unlock(:lock_namespace::integer, :lock_id::integer) as released
