-- The server's connection ceiling for ordinary roles, so the daemon can compare it with
-- the connections its configuration will open (database.connection_check).
select current_setting('max_connections')::integer as max_connections,
       current_setting('superuser_reserved_connections')::integer as reserved
