-- Sweep's schema as released in v0.1.0: every table, index and constraint, in the `sweep`
-- schema. Migrations after this one are append-only and schema-only: a new table, column or
-- index is a new file with the next number; functions are not migrations (runner/sql/,
-- installed by `sweep migrate` after the migrations: docs/architecture.md, "SQL functions").
--
-- Written once from the schema that the pre-release migrations 0001-0023 built, and tested to
-- build exactly that (runner/tests/schema/chain.txt). Databases made before v0.1.0 are
-- re-created, not upgraded (CHANGELOG.md, v0.1.0).
--
-- Task states, and which statement moves a task between them: docs/architecture.md, "The
-- state machine". The tables in short:
--   tasks           live work only (pending, running, retrying); a task that ends moves to
--                   finished_tasks or dead_tasks in the statement that ends it
--   finished_tasks  succeeded and cancelled tasks, partitioned by UTC day of finished_at
--   dead_tasks      tasks out of attempts, or failed permanently, with their error history
--   queues          one row per (tenant, task_type) that ever had work: the claim's hint
--   modules, active_modules   every uploaded handler version, and the one that runs
--   tenants, tenant_tokens    who may call the admin API, their caps and extra tokens
--   schedules       cron schedules
--   runners         the runner processes alive, by heartbeat
--   _functions      which SQL functions `sweep migrate` installed (queue/functions.rs)

create schema if not exists sweep;

-- Live tasks. `tasks_queue` serves the claim: each queue's waiting tasks in claim order
-- (priority, then run_at, then id). Finished rows never stay here, so neither the claim's
-- index nor the table's statistics describe history.
create table sweep.tasks (
    id                  bigserial   primary key,
    tenant              text        not null default 'default',
    task_type           text        not null,
    payload             jsonb       not null,
    state               text        not null default 'pending',
    priority            integer     not null default 0,
    run_at              timestamptz not null default now(),
    attempts            integer     not null default 0,
    max_attempts        integer     not null default 5,
    lease_owner         uuid,
    lease_expires_at    timestamptz,
    dedup_key           text,
    last_error          text,
    errors              jsonb       not null default '[]',
    module_sha256       text,
    created_at          timestamptz not null default now(),
    updated_at          timestamptz not null default now(),
    -- When the current (or last) attempt started: set by every claim. Not indexed, so it does
    -- not get in the way of HOT updates.
    started_at          timestamptz,
    -- A cancel of the running attempt was requested (queue::cancel): every end of that
    -- attempt moves the task to finished_tasks as cancelled. Null on the hot path.
    cancel_requested_at timestamptz,

    constraint tasks_lease_iff_running
        check ((state = 'running') = (lease_owner is not null and lease_expires_at is not null)),
    constraint tasks_attempts_in_range
        check (max_attempts >= 1 and attempts >= 0),
    constraint tasks_task_type_shape
        check (length(task_type) between 1 and 128),
    constraint tasks_errors_is_array
        check (jsonb_typeof(errors) = 'array'),
    constraint tasks_state_live
        check (state in ('pending', 'running', 'retrying'))
-- A queue table empties and refills all day: VACUUM must never truncate its trailing empty
-- pages, which takes an ACCESS EXCLUSIVE lock that stalls every claim and enqueue behind it.
) with (fillfactor = 80, vacuum_truncate = false);

-- Leases to renew (heartbeat) and to rescue (reaper).
create index tasks_running on sweep.tasks (lease_expires_at)
    where state = 'running';

-- One live task per (tenant, dedup_key); a task that ends frees the key.
create unique index tasks_dedup on sweep.tasks (tenant, dedup_key)
    where dedup_key is not null and state in ('pending', 'running', 'retrying');

create index tasks_queue on sweep.tasks (tenant, task_type, priority desc, run_at, id)
    where state in ('pending', 'retrying');

-- The dead-letter table: the task row as it was when it died, with its whole error history.
create table sweep.dead_tasks (
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
    died_at       timestamptz not null default now(),
    started_at    timestamptz
);

create index dead_tasks_by_type on sweep.dead_tasks (tenant, task_type, id);
create index dead_tasks_died_at on sweep.dead_tasks (died_at);

-- Who is alive: each runner process registers here and heartbeats.
create table sweep.runners (
    id                uuid        primary key,
    host              text        not null,
    pid               integer     not null,
    started_at        timestamptz not null default now(),
    last_heartbeat_at timestamptz not null default now()
);

-- The handler registered for each (tenant, task_type): every uploaded version kept, one of
-- them active. Limits null: the runner's default, capped by its maxima when the task runs.
create table sweep.modules (
    tenant           text        not null,
    task_type        text        not null,
    version          integer     not null,
    sha256           text        not null,
    bytes            bytea       not null,
    fuel             bigint,
    timeout_ms       bigint,
    memory_bytes     bigint,
    max_attempts     integer,
    backoff_base_ms  bigint,
    backoff_cap_ms   bigint,
    created_at       timestamptz not null default now(),
    -- Most tasks of the type running at once across all runners (null: no limit).
    max_running      integer,

    primary key (tenant, task_type, version),
    constraint modules_version_positive check (version >= 1),
    constraint modules_sha256_hex check (sha256 ~ '^[0-9a-f]{64}$'),
    constraint modules_limits_positive check (
        coalesce(fuel, 1) > 0 and coalesce(timeout_ms, 1) > 0 and coalesce(memory_bytes, 1) > 0
        and coalesce(max_attempts, 1) >= 1 and coalesce(backoff_base_ms, 1) > 0
        and coalesce(backoff_cap_ms, backoff_base_ms, 1) >= coalesce(backoff_base_ms, 1)),
    constraint modules_max_running_positive
        check (coalesce(max_running, 1) >= 1)
);

-- Uploading the same bytes with the same limits again returns the existing version.
create unique index modules_identity
    on sweep.modules (tenant, task_type, sha256, fuel, timeout_ms, memory_bytes, max_attempts,
                      backoff_base_ms, backoff_cap_ms, max_running) nulls not distinct;

-- A claim resolves the active version in the statement that claims the task, so activating a
-- version takes effect for the next claim.
create table sweep.active_modules (
    tenant       text        not null,
    task_type    text        not null,
    version      integer     not null,
    activated_at timestamptz not null default now(),
    primary key (tenant, task_type),
    foreign key (tenant, task_type, version) references sweep.modules (tenant, task_type, version)
);

-- Tenants: a bearer token (only its SHA-256, hex, is stored; shown once, at creation) and the
-- caps that bound what the tenant can ask for (null: no cap beyond the runner's maxima). The
-- name 'default' needs no row. A pause (paused_at, paused_by) is the operator's, and is copied
-- onto every queue of the tenant (queues.tenant_paused), as the weight is.
create table sweep.tenants (
    name              text        primary key,
    token_sha256      text        not null,
    max_module_bytes  bigint,
    max_fuel          bigint,
    max_timeout_ms    bigint,
    max_memory_bytes  bigint,
    -- Most tasks of the tenant running at once across all runners (the claim's try-lock).
    max_running       integer,
    created_at        timestamptz not null default now(),
    -- The tenant's share of the runners' slots, relative to other backlogged tenants.
    weight            integer     not null default 1,
    -- Largest payload it may enqueue and largest result its tasks may write (null: the
    -- deployment's --max-payload-bytes and --output-bytes).
    max_payload_bytes bigint,
    max_result_bytes  bigint,
    paused_at         timestamptz,
    paused_by         text,

    constraint tenants_name_shape check (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    constraint tenants_token_sha256_hex check (token_sha256 ~ '^[0-9a-f]{64}$'),
    constraint tenants_caps_positive check (
        coalesce(max_module_bytes, 1) > 0 and coalesce(max_fuel, 1) > 0
        and coalesce(max_timeout_ms, 1) > 0 and coalesce(max_memory_bytes, 1) > 0
        and coalesce(max_running, 0) >= 0),
    constraint tenants_weight_range check (weight between 1 and 10000),
    constraint tenants_size_limits_positive check (
        coalesce(max_payload_bytes, 1) > 0 and coalesce(max_result_bytes, 1) > 0),
    constraint tenants_paused_both check ((paused_at is null) = (paused_by is null))
);

create unique index tenants_by_token on sweep.tenants (token_sha256);

-- The claim reads only capped tenants; with no cap anywhere this index is empty.
create index tenants_capped on sweep.tenants (name) where max_running is not null;

-- A queue is one (tenant, task_type): a row for every queue that ever had work. `next_run_at`
-- is the claim's hint, when the earliest waiting task is due (null: nothing waits); the rules
-- that keep it are in runner/sql/wake_queues.sql. `weight` (the tenant's), `max_running` (the
-- active module's) and `tenant_paused` are copies, so the claim reads one table. `ring` is a
-- random position: each claim looks at a bounded window of due queues from a random point.
-- A rate limit is a token bucket on the row (runner/sql/flow_tokens.sql).
create table sweep.queues (
    tenant        text        not null,
    task_type     text        not null,
    next_run_at   timestamptz,
    weight        integer     not null default 1,
    max_running   integer,
    ring          integer     not null default floor(random() * 2147483647)::integer,
    -- A pause of the task type by its tenant.
    paused_at     timestamptz,
    paused_by     text,
    tenant_paused boolean     not null default false,
    paused        boolean     generated always as (paused_at is not null or tenant_paused) stored,
    rate_per_sec  float8,
    burst         integer,
    tokens        float8,
    refilled_at   timestamptz,
    primary key (tenant, task_type),
    constraint queues_paused_both check ((paused_at is null) = (paused_by is null)),
    constraint queues_rate_limit check (
        (rate_per_sec is null) = (burst is null)
        and coalesce(rate_per_sec, 1) > 0 and coalesce(rate_per_sec, 1) <= 1000000
        and coalesce(burst, 1) between 1 and 1000000)
);

-- The claim's window: due queues that are not paused, in ring order; next_run_at in the
-- index, so queues whose hint is still in the future are passed over without a heap visit.
create index queues_due on sweep.queues (ring, next_run_at)
    where next_run_at is not null and not paused;

-- Finished (succeeded and cancelled) tasks, partitioned by range of finished_at, one
-- partition per UTC day, made ahead and dropped whole by retention (runner/sql/retention.sql),
-- plus the default partition, which catches a row no day partition covers. Statements read
-- and write the parent only. The primary key holds the partition key; ids are unique anyway,
-- a task row moving here once, from tasks.
create table sweep.finished_tasks (
    id            bigint      not null,
    tenant        text        not null,
    task_type     text        not null,
    payload       jsonb       not null,
    state         text        not null,
    priority      integer     not null,
    attempts      integer     not null,
    max_attempts  integer     not null,
    run_at        timestamptz not null,
    dedup_key     text,
    last_error    text,
    errors        jsonb       not null,
    result        jsonb,
    module_sha256 text,
    -- The bounded stderr tail of the last attempt (null: the handler logged nothing).
    logs          text,
    created_at    timestamptz not null,
    started_at    timestamptz,
    finished_at   timestamptz not null default now(),

    constraint finished_tasks_state_known check (state in ('succeeded', 'cancelled')),
    constraint finished_tasks_pkey primary key (id, finished_at)
) partition by range (finished_at);

-- "Completed in the last minute", and retention's deletes in the default partition.
create index finished_tasks_finished_at on sweep.finished_tasks (finished_at);

create table sweep.finished_tasks_default partition of sweep.finished_tasks default;

-- Extra tokens of a tenant: read-only tokens that read what its main token reads and change
-- nothing. Only SHA-256 (hex) is stored; lookups check tenants.token_sha256 first.
create table sweep.tenant_tokens (
    token_sha256 text        primary key,
    tenant       text        not null references sweep.tenants (name) on delete cascade,
    read_only    boolean     not null default true,
    created_at   timestamptz not null default now(),

    constraint tenant_tokens_sha256_hex check (token_sha256 ~ '^[0-9a-f]{64}$'),
    -- A write token is the tenant's main token.
    constraint tenant_tokens_read_only check (read_only)
);

create index tenant_tokens_by_tenant on sweep.tenant_tokens (tenant);

-- Cron schedules: each row enqueues one task per tick of its cron expression in its IANA time
-- zone. `next_run_at` is the next tick to enqueue (UTC); a runner's scheduler locks due rows
-- (FOR UPDATE SKIP LOCKED), enqueues the tick's task with the dedup key
-- 'schedule:<id>:<tick>' and advances next_run_at in the same transaction.
create table sweep.schedules (
    id             bigserial primary key,
    tenant         text not null,
    name           text not null,
    cron           text not null,
    timezone       text not null default 'UTC',
    task_type      text not null,
    payload        jsonb not null default '{}',
    priority       int4 not null default 0,
    max_attempts   int4,
    -- skip: no task for a tick while the schedule's previous task is still live; allow.
    overlap        text not null default 'skip' check (overlap in ('skip', 'allow')),
    -- After downtime: latest: the latest missed tick runs once; skip: late ticks do not run.
    catch_up       text not null default 'latest' check (catch_up in ('latest', 'skip')),
    paused_at      timestamptz,
    next_run_at    timestamptz not null,
    -- The tick of the last task enqueued, and that task.
    last_run_at    timestamptz,
    last_task_id   int8,
    -- Ticks that enqueued nothing because the previous task was live (overlap = skip).
    skipped_ticks  int8 not null default 0,
    created_at     timestamptz not null default now(),
    unique (tenant, name)
);

-- The scheduler's scan: due, unpaused schedules in tick order.
create index schedules_due on sweep.schedules (next_run_at) where paused_at is null;

-- What `sweep migrate` installed of runner/sql/: the files' hash and the version of the sweep
-- that installed them, which a store compares with its own at open. One row.
create table sweep._functions (
    singleton     boolean     primary key default true check (singleton),
    sha256        text        not null,
    sweep_version text        not null,
    installed_at  timestamptz not null default now()
);
