-- The running tasks by queue (issue 32): the claim counts the running tasks of the tenants it
-- shares slots among, one index range per queue, where it read every running task through
-- the lease index and grouped them all, per claim. The tenant and queue caps count through it
-- too. The lease sweep (queue/maintenance.rs) reads the running tasks whole through it, once
-- per reaper interval; and with `lease_expires_at` in no index, a lease renewal can be a HOT
-- update.
drop index sweep.tasks_running;
create index tasks_running on sweep.tasks (tenant, task_type) where state = 'running';
