-- When the current (or last) attempt of a task started: set by every claim. Enqueue-to-start
-- latency is started_at - run_at. Not indexed, so it does not get in the way of HOT updates.
alter table tasks add column started_at timestamptz;
alter table dead_tasks add column started_at timestamptz;
