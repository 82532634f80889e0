-- Sweep's own schema: every table and function of Sweep lives in `sweep`, so Sweep can share a
-- database with an application (whose `public.tasks` is its own business).
--
-- `sweep migrate` runs every migration with `search_path = sweep` (see queue/store.rs), so on a
-- new database 0001..0009 already created everything in `sweep`. (This one names the schema
-- anyway: it also runs on databases migrated by hand.) A database migrated before
-- this migration holds it all in `public`: it moves over here, with every row, index,
-- constraint and sequence (they follow their table). The bookkeeping rows were moved to
-- `sweep._sqlx_migrations` before this ran. The test for this is queue_migrations.rs.
create schema if not exists sweep;

do $$
declare
    t text;
    f regprocedure;
begin
    if to_regclass('sweep.tasks') is null and to_regclass('public.tasks') is not null then
        foreach t in array array['tasks', 'finished_tasks', 'dead_tasks', 'runners', 'modules',
                                 'active_modules', 'tenants', 'queues'] loop
            execute format('alter table public.%I set schema sweep', t);
        end loop;
        for f in
            select p.oid::regprocedure from pg_proc p
            where p.pronamespace = 'public'::regnamespace
              and p.proname in ('sweep_tenant_free_slots', 'sweep_wake_queues',
                                'sweep_queue_next_run_at', 'sweep_queue_free_slots',
                                'sweep_claim')
        loop
            execute format('alter function %s set schema sweep', f);
        end loop;
    end if;
end $$;

-- Function bodies name tables plainly; they resolve them in `sweep` whatever the caller's
-- search_path is. The functions the runner calls on every claim also carry the planner
-- settings they were written for, scoped to their own statements (these used to be set on
-- every connection of the pool, where they reached admin reads too): plans made once and
-- kept (no re-planning per call), never a seq or bitmap scan of a backlog however the
-- statistics looked when the plan was made, and no JIT (which pricing paths out would
-- otherwise trigger, and which never pays for statements this short).
alter function sweep.sweep_tenant_free_slots(text, integer)
    set search_path = sweep;
alter function sweep.sweep_wake_queues(text[], text[], timestamptz[])
    set search_path = sweep;
alter function sweep.sweep_queue_next_run_at(text, text, bigint[])
    set search_path = sweep
    set plan_cache_mode = force_generic_plan
    set enable_seqscan = off
    set enable_bitmapscan = off
    set jit = off;
alter function sweep.sweep_queue_free_slots(text, text, integer)
    set search_path = sweep;
alter function sweep.sweep_claim(uuid, bigint, text[], bigint, boolean, integer)
    set search_path = sweep
    set plan_cache_mode = force_generic_plan
    set enable_seqscan = off
    set enable_bitmapscan = off
    set jit = off;

-- 0008 set this in an edit made after some databases had applied it.
alter table sweep.tasks set (vacuum_truncate = false);
