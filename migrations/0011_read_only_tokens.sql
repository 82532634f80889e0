-- (Names its schema: it also runs on databases migrated by hand, see 0010.)
--
-- Read-only tokens: a tenant may hold any number of extra tokens that can read everything its
-- main token reads (GET routes of the admin API, every page of the dashboard) and change
-- nothing (writes answer 403 `read_only`). The main token stays in tenants.token_sha256.
--
-- As with tenants.token_sha256, only the SHA-256 (hex) of each token is stored. A token hash
-- is unique across both tables in practice (32 random bytes); lookups check tenants first.

create table sweep.tenant_tokens (
    token_sha256 text        primary key,
    tenant       text        not null references sweep.tenants (name) on delete cascade,
    read_only    boolean     not null default true,
    created_at   timestamptz not null default now(),

    constraint tenant_tokens_sha256_hex check (token_sha256 ~ '^[0-9a-f]{64}$'),
    -- Only read-only tokens live here for now; a write token is the tenant's main token.
    constraint tenant_tokens_read_only check (read_only)
);

create index tenant_tokens_by_tenant on sweep.tenant_tokens (tenant);
