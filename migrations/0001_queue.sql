-- The queue: live tasks, the dead-letter table and the runners that work them.
--
-- Task states and who moves a task between them (all SQL lives in runner/src/queue/):
--   pending   -> running    claim_batch (a runner takes the lease)
--   retrying  -> running    claim_batch, once run_at has passed
--   running   -> succeeded  complete_batch (fenced by lease owner and attempt)
--   running   -> retrying   fail_batch, or the reaper when the lease expired
--   running   -> dead       fail_batch / reaper when attempts are exhausted or the failure is
--                           permanent: the row moves to dead_tasks in the same statement
--   pending | retrying -> cancelled   cancel
--   dead      -> pending    requeue (row moves back from dead_tasks, history kept)
--   running   -> pending    release (graceful shutdown hands back unstarted work)
-- succeeded and cancelled rows stay until retention deletes them.

create table tasks (
    id               bigserial primary key,
    tenant           text        not null default 'default',
    task_type        text        not null,
    payload          jsonb       not null,
    state            text        not null default 'pending',
    priority         integer     not null default 0,
    run_at           timestamptz not null default now(),
    attempts         integer     not null default 0,
    max_attempts     integer     not null default 5,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    dedup_key        text,
    last_error       text,
    errors           jsonb       not null default '[]',
    result           jsonb,
    module_sha256    text,
    created_at       timestamptz not null default now(),
    updated_at       timestamptz not null default now(),
    finished_at      timestamptz,

    constraint tasks_state_known
        check (state in ('pending', 'running', 'retrying', 'succeeded', 'cancelled')),
    constraint tasks_finished_iff_terminal
        check ((state in ('succeeded', 'cancelled')) = (finished_at is not null)),
    constraint tasks_lease_iff_running
        check ((state = 'running') = (lease_owner is not null and lease_expires_at is not null)),
    constraint tasks_attempts_in_range
        check (max_attempts >= 1 and attempts >= 0),
    constraint tasks_task_type_shape
        check (length(task_type) between 1 and 128),
    constraint tasks_errors_is_array
        check (jsonb_typeof(errors) = 'array')
) with (fillfactor = 80);

-- Serves exactly the claim query: due work in priority order. Finished rows are not in it, so
-- the claim path does not slow down as history accumulates.
create index tasks_claim on tasks (priority desc, run_at, id)
    where state in ('pending', 'retrying');

-- Leases to renew (heartbeat) and to rescue (reaper).
create index tasks_running on tasks (lease_expires_at)
    where state = 'running';

-- One live task per (tenant, dedup_key); finished tasks free the key.
create unique index tasks_dedup on tasks (tenant, dedup_key)
    where dedup_key is not null and state in ('pending', 'running', 'retrying');

-- Retention and "completed in the last minute".
create index tasks_finished on tasks (finished_at)
    where state in ('succeeded', 'cancelled');

-- The dead-letter table: the task row as it was when it died, with its whole error history.
create table dead_tasks (
    id            bigint      primary key,
    tenant        text        not null,
    task_type     text        not null,
    payload       jsonb       not null,
    priority      integer     not null,
    attempts      integer     not null,
    max_attempts  integer     not null,
    dedup_key     text,
    last_error    text,
    errors        jsonb       not null,
    module_sha256 text,
    reason        text        not null,
    created_at    timestamptz not null,
    died_at       timestamptz not null default now()
);

create index dead_tasks_by_type on dead_tasks (tenant, task_type, id);
create index dead_tasks_died_at on dead_tasks (died_at);

-- Who is alive: each runner process registers here and heartbeats.
create table runners (
    id                uuid        primary key,
    host              text        not null,
    pid               integer     not null,
    started_at        timestamptz not null default now(),
    last_heartbeat_at timestamptz not null default now()
);
