-- Capabilities (issue 27): what a handler is given beyond computing, and what it used. A
-- tenant's egress allow list and HTTP limits, its secrets (encrypted), the secrets each module
-- version receives, the usage of each successful attempt, and usage totals per tenant, task
-- type and day. Schema only.

-- A tenant's egress policy: the hosts its handlers may send HTTP requests to (entries in the
-- canonical form `sandbox::EgressPolicy::parse` gives them; empty, the default: none) and its
-- overrides of the deployment's HTTP limits (null: the default). Keyed by name without a
-- foreign key, as `tasks.tenant` is, so the `default` tenant (which has no row in `tenants`)
-- has one too.
create table sweep.tenant_egress (
    tenant             text        primary key,
    allow              text[]      not null default '{}',
    max_requests       integer,
    max_response_bytes bigint,
    request_timeout_ms bigint,
    updated_at         timestamptz not null default now(),
    constraint tenant_egress_tenant_shape check (tenant ~ '^[A-Za-z0-9._-]{1,64}$'),
    constraint tenant_egress_limits_range check (
        coalesce(max_requests, 0) >= 0 and coalesce(max_response_bytes, 0) >= 0
        and coalesce(request_timeout_ms, 1) > 0)
);

-- A tenant's secrets, each sealed with XChaCha20-Poly1305 under the deployment's key
-- (SWEEP_SECRETS_KEY): `nonce` is the random 24-byte nonce, `sealed` the ciphertext with its
-- 16-byte tag, and the associated data binds it to its tenant and name, so a row copied to
-- another tenant or name does not open. `key_id` names the key it was sealed under (the first
-- 16 hex digits of the key's SHA-256), so a runner with another key says so. The value itself
-- is never stored in clear.
create table sweep.secrets (
    tenant     text        not null,
    name       text        not null,
    nonce      bytea       not null,
    sealed     bytea       not null,
    key_id     text        not null,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    primary key (tenant, name),
    constraint secrets_tenant_shape check (tenant ~ '^[A-Za-z0-9._-]{1,64}$'),
    -- An environment variable's name; `SWEEP_` is the runner's own prefix.
    constraint secrets_name_shape
        check (name ~ '^[A-Za-z_][A-Za-z0-9_]{0,127}$' and upper(name) not like 'SWEEP\_%'),
    constraint secrets_nonce_length check (length(nonce) = 24),
    constraint secrets_key_id_hex check (key_id ~ '^[0-9a-f]{16}$')
);

-- The secrets a module version receives as environment variables, named at upload. Part of
-- a version's identity: the same bytes and limits with other secrets are another version.
alter table sweep.modules add column secrets text[] not null default '{}';
drop index sweep.modules_identity;
create unique index modules_identity
    on sweep.modules (tenant, task_type, sha256, fuel, timeout_ms, memory_bytes, max_attempts,
                      backoff_base_ms, backoff_cap_ms, max_running, secrets) nulls not distinct;

-- What a task's successful attempt used (its failed attempts carry theirs in `errors`):
-- `{"duration_ms", "fuel_used", "peak_memory_bytes", "http_requests", "http_refused",
-- "bytes_sent", "bytes_received"}`. Null for a task finished by a cancel before it ran.
alter table sweep.finished_tasks add column usage jsonb;

-- Usage totals per tenant, UTC day, task type and reporting runner, added to by the
-- statements that record attempts (complete_batch, fail_batch) in the same statement. The
-- runner is part of the key so that no two runners ever update the same row: reports of
-- different runners never wait on each other here. Not touched by the retention of
-- finished_tasks; read summed over runners (`GET /v1/usage`).
create table sweep.usage_days (
    tenant            text   not null,
    day               date   not null,
    task_type         text   not null,
    runner            uuid   not null,
    attempts          int8   not null default 0,
    succeeded         int8   not null default 0,
    failed            int8   not null default 0,
    wall_ms           int8   not null default 0,
    fuel              numeric not null default 0,
    -- The largest memory any one attempt held.
    peak_memory_bytes int8   not null default 0,
    http_requests     int8   not null default 0,
    http_refused      int8   not null default 0,
    bytes_sent        int8   not null default 0,
    bytes_received    int8   not null default 0,
    primary key (tenant, day, task_type, runner)
);
create index usage_days_by_day on sweep.usage_days (day);
