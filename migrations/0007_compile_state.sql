-- Compile state (issue 30): an upload whose compile outlasts the request is answered at once
-- (202) and compiled on in the background. Schema only.

-- A version's compile: 'ready' (compiled and accepted: the only state that may be active),
-- 'compiling' (registered, its compile still running) or 'rejected' (the compile refused it,
-- or was interrupted; `compile_error` says why). Every version before this migration was
-- compiled before it was stored, so the default is 'ready'.
alter table sweep.modules
    add column compile_state text not null default 'ready',
    add column compile_error text,
    add constraint modules_compile_state
        check (compile_state in ('compiling', 'ready', 'rejected')),
    add constraint modules_compile_error
        check ((compile_state = 'rejected') = (compile_error is not null));

-- Only a compiled version may be the active one. Enforced here by the foreign key's target:
-- the module statements (queue/modules.rs, queue/compiling.rs) activate only 'ready' rows.
create index modules_compiling on sweep.modules (created_at) where compile_state = 'compiling';

-- A queue whose task type has no active version yet, only one still compiling, is held: its
-- tasks wait (the claim passes it over, as it does a paused one) instead of being claimed
-- without a handler and dead-lettered. `paused` is what the claim reads, so it is redefined
-- to include the hold (Postgres 15 cannot change a generated column's expression in place;
-- its two partial indexes go and come back with it).
alter table sweep.queues add column module_compiling boolean not null default false;
drop index sweep.queues_due;
drop index sweep.queues_next_due;
alter table sweep.queues drop column paused;
alter table sweep.queues add column paused boolean
    generated always as (paused_at is not null or tenant_paused or module_compiling) stored;
create index queues_due on sweep.queues (ring, next_run_at)
    where next_run_at is not null and not paused;
create index queues_next_due on sweep.queues (next_run_at)
    where next_run_at is not null and not paused;
