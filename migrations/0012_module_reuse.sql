-- Warm instances (issue 30): a module version may let the runner keep a component's instance
-- after a task that ended cleanly and run later tasks of that version on it, at most `reuse`
-- tasks per instance. Null: a fresh instance for every task. Part of a version's identity,
-- like its limits and secrets. Schema only.
alter table sweep.modules
    add column reuse integer,
    add constraint modules_reuse_range check (reuse between 1 and 1000000);
drop index sweep.modules_identity;
create unique index modules_identity
    on sweep.modules (tenant, task_type, sha256, fuel, timeout_ms, memory_bytes, max_attempts,
                      backoff_base_ms, backoff_cap_ms, max_running, secrets, reuse)
    nulls not distinct;
