-- Tenants: who may call the admin API, and the caps that bound what each one can ask for.
--
-- A tenant authenticates with a bearer token that is shown once, at creation; only its
-- SHA-256 (hex) is stored. Tasks, modules and dead tasks carry the tenant's name in their
-- `tenant` column; the name 'default' is what operator-enqueued work uses when no tenant is
-- named, and it needs no row here. A tenant without a row has no caps.
--
-- Caps (null: no cap beyond the runner's own maxima):
--   max_module_bytes  largest module the tenant may upload
--   max_fuel, max_timeout_ms, max_memory_bytes
--                     the most a module of this tenant may ask for (checked at upload; when
--                     the runner default is higher, the cap is stored with the module)
--   max_running       the most tasks of this tenant running at once across all runners,
--                     enforced by claim_batch (see sweep_tenant_free_slots below)

create table tenants (
    name             text        primary key,
    token_sha256     text        not null,
    max_module_bytes bigint,
    max_fuel         bigint,
    max_timeout_ms   bigint,
    max_memory_bytes bigint,
    max_running      integer,
    created_at       timestamptz not null default now(),

    constraint tenants_name_shape check (name ~ '^[A-Za-z0-9._-]{1,64}$'),
    constraint tenants_token_sha256_hex check (token_sha256 ~ '^[0-9a-f]{64}$'),
    constraint tenants_caps_positive check (
        coalesce(max_module_bytes, 1) > 0 and coalesce(max_fuel, 1) > 0
        and coalesce(max_timeout_ms, 1) > 0 and coalesce(max_memory_bytes, 1) > 0
        and coalesce(max_running, 0) >= 0)
);

create unique index tenants_by_token on tenants (token_sha256);

-- The claim statement reads only capped tenants; with no cap anywhere this index is empty.
create index tenants_capped on tenants (name) where max_running is not null;

-- How many more tasks `p_tenant` may start now, given its cap `p_max`.
--
-- Called by claim_batch once per capped tenant, before it picks tasks. Claims of one capped
-- tenant are serialised by a transaction-scoped advisory lock, taken with try-lock: when
-- another runner is claiming for this tenant right now, the answer is 0 and this claim skips
-- the tenant (as SKIP LOCKED skips a locked row) instead of waiting, so claimers never block
-- or deadlock on each other. The lock is held until the claiming transaction commits.
--
-- VOLATILE on purpose: a volatile function takes a fresh snapshot for each query it runs (in
-- READ COMMITTED, the default), so the count below sees every claim committed before the
-- lock was granted, even those committed after the calling statement started.
create function sweep_tenant_free_slots(p_tenant text, p_max integer) returns integer
language plpgsql volatile strict as $$
declare
    running integer;
begin
    -- 1937204592 = 0x73776570 ('swep' in ASCII): a lock key space of Sweep's own.
    if not pg_try_advisory_xact_lock(1937204592, hashtext(p_tenant)) then
        return 0;
    end if;
    select count(*) into running from tasks where state = 'running' and tenant = p_tenant;
    return greatest(p_max - running, 0);
end
$$;
