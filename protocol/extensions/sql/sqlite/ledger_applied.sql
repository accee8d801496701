-- Checked inside the migration's BEGIN IMMEDIATE, so a process that lost the race for
-- the write lock sees the winner's row and skips the file.
select 1 as applied from cairnqd_migrations where name = :name
