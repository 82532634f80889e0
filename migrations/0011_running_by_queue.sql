-- The running tasks by queue (issue 32): the claim counts the running tasks of the tenants it
-- shares slots among, one index range per queue, where it read every running task through
-- the lease index and grouped them all, per claim. The tenant and queue caps count through it
-- too. The lease sweep (queue/maintenance.rs) reads the running tasks whole through it, once
-- per reaper interval; and with `lease_expires_at` in no index, a lease renewal can be a HOT
-- update.
--
-- `id` last: claims take a queue's tasks about in id order, so its entries are added at the
-- end of its range, as they were at the end of the lease index. Keyed by queue alone, every
-- entry of a queue was a duplicate of the others, and the one-queue claim + complete bench
-- ran 9% slower than on the lease index (3% with `id`).
drop index sweep.tasks_running;
create index tasks_running on sweep.tasks (tenant, task_type, id) where state = 'running';
