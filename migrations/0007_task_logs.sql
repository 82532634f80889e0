-- The bounded stderr tail of a task's last successful attempt (failed attempts keep theirs in
-- the error history). Null when the handler logged nothing.
alter table tasks add column logs text;
