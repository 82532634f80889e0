-- The module registry: the Wasm handler registered for each (tenant, task_type), every
-- uploaded version kept, one of them active. A runner resolves the active version in the same
-- statement that claims a task, so activating a version takes effect for the next claim.

create table modules (
    tenant           text        not null,
    task_type        text        not null,
    version          integer     not null,
    sha256           text        not null,
    bytes            bytea       not null,
    -- Per-module overrides of the runner defaults (null: use the default), capped by the
    -- runner's maxima when the task runs.
    fuel             bigint,
    timeout_ms       bigint,
    memory_bytes     bigint,
    max_attempts     integer,
    backoff_base_ms  bigint,
    backoff_cap_ms   bigint,
    created_at       timestamptz not null default now(),

    primary key (tenant, task_type, version),
    constraint modules_version_positive check (version >= 1),
    constraint modules_sha256_hex check (sha256 ~ '^[0-9a-f]{64}$'),
    constraint modules_limits_positive check (
        coalesce(fuel, 1) > 0 and coalesce(timeout_ms, 1) > 0 and coalesce(memory_bytes, 1) > 0
        and coalesce(max_attempts, 1) >= 1 and coalesce(backoff_base_ms, 1) > 0
        and coalesce(backoff_cap_ms, backoff_base_ms, 1) >= coalesce(backoff_base_ms, 1))
);

-- Uploading the same bytes with the same limits again returns the existing version.
create unique index modules_identity
    on modules (tenant, task_type, sha256, fuel, timeout_ms, memory_bytes, max_attempts,
                backoff_base_ms, backoff_cap_ms) nulls not distinct;

create table active_modules (
    tenant       text        not null,
    task_type    text        not null,
    version      integer     not null,
    activated_at timestamptz not null default now(),
    primary key (tenant, task_type),
    foreign key (tenant, task_type, version) references modules (tenant, task_type, version)
);

-- Which module ran a task is recorded on the task (tasks.module_sha256).
