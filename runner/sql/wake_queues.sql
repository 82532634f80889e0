-- Queue hints: how claims find due work without scanning tasks.
--
-- `queues` has a row for every queue (tenant, task_type) that ever had work, with
-- `next_run_at`: when its earliest waiting task is due (null: nothing waiting). The claim
-- (claim.sql) reads only the queues whose hint has passed. The hint is kept by these rules:
--   lowered  by whoever makes a task wait (enqueue, retry, release, requeue), through
--            sweep_wake_queues, which holds the row against a raise until it commits;
--   raised   (or cleared) only by a claim that found the queue short of due work, and by the
--            runners' hint repair, each under FOR UPDATE SKIP LOCKED and with a fresh look at
--            the queue taken after the lock (sweep_queue_next_run_at). FOR UPDATE conflicts
--            with the lowering's lock, so a hint is never raised past a task whose enqueue is
--            in flight; a raise that cannot get the lock is skipped, which only leaves the hint
--            early.
-- A hint that is early costs one probe that finds nothing; a hint that is late (a lowering
-- that skipped a row another writer was lowering at that moment) is repaired by the runners'
-- maintenance within its interval.


-- When the earliest waiting task of a queue is due, leaving out `p_exclude` (tasks the
-- calling claim is taking right now); null when nothing waits. One index probe per distinct
-- priority in the queue, however long its backlog. VOLATILE: every query here takes a fresh
-- snapshot, so a caller holding the queue row FOR UPDATE sees every enqueue committed before.
create or replace function sweep.sweep_queue_next_run_at(p_tenant text, p_task_type text,
                                                         p_exclude bigint[])
returns timestamptz
language plpgsql volatile
set search_path = sweep
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
declare
    p    integer;
    due  timestamptz;
    best timestamptz;
begin
    select priority into p from tasks
    where tenant = p_tenant and task_type = p_task_type and state in ('pending', 'retrying')
      and id <> all(p_exclude)
    order by priority desc limit 1;
    while p is not null loop
        select run_at into due from tasks
        where tenant = p_tenant and task_type = p_task_type and state in ('pending', 'retrying')
          and priority = p and id <> all(p_exclude)
        order by priority desc, run_at limit 1;
        best := least(best, due);
        select max(priority) into p from (
            select priority from tasks
            where tenant = p_tenant and task_type = p_task_type
              and state in ('pending', 'retrying') and priority < p and id <> all(p_exclude)
            order by priority desc limit 1
        ) lower_priority;
    end loop;
    return best;
end
$$;

-- sweep_queue_next_run_at of several queues in one query, for a caller that holds all their
-- rows FOR UPDATE: `p_queues` (the rows' ctids, returned with each answer), `p_tenants` and
-- `p_task_types` side by side. One fresh snapshot for all of them (VOLATILE), taken after the
-- caller's locks. Per queue, two index probes in the common case of one priority waiting (the
-- earliest task of the highest priority, and whether a lower one waits); a queue with several
-- priorities waiting goes through sweep_queue_next_run_at. A claim that empties many queues
-- (10,000 tenants with a task or two each: 125 a claim) paid a function call with three
-- queries of its own per queue, four times this.
create or replace function sweep.sweep_queues_next_run_at(p_queues tid[], p_tenants text[],
                                                          p_task_types text[],
                                                          p_exclude bigint[])
returns table (queue tid, next_run_at timestamptz)
language plpgsql volatile
set search_path = sweep
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
begin
    return query
    select k.queue,
           case when lower_p.priority is null then top.run_at
                else sweep_queue_next_run_at(k.tenant, k.task_type, p_exclude) end
    from unnest(p_queues, p_tenants, p_task_types) as k(queue, tenant, task_type)
    left join lateral (
        select t.priority, t.run_at from tasks t
        where t.tenant = k.tenant and t.task_type = k.task_type
          and t.state in ('pending', 'retrying') and t.id <> all(p_exclude)
        order by t.priority desc, t.run_at
        limit 1
    ) top on true
    left join lateral (
        select t.priority from tasks t
        where t.tenant = k.tenant and t.task_type = k.task_type
          and t.state in ('pending', 'retrying') and t.priority < top.priority
          and t.id <> all(p_exclude)
        order by t.priority desc
        limit 1
    ) lower_p on true;
end
$$;

-- Makes sure each queue has a row and its hint is no later than the given time, holding each
-- row FOR KEY SHARE until the caller commits. One call per statement that makes tasks wait,
-- with one entry per distinct queue. Called by sweep_wake_queues for queues without a row.
--
-- The KEY SHARE lock is what makes clearing safe: a claim clears a hint only under FOR UPDATE,
-- which waits for no one (SKIP LOCKED) and is refused while any writer that may have added a
-- task holds KEY SHARE; once this transaction commits, its tasks are visible to the fresh look
-- the next clear takes. Two writers lowering the same hint at once: the second skips (its task
-- is no earlier than the first's in the common case; the hint repair covers the rest).
--
-- A new queue row copies its tenant's weight and pause (`tenant_paused`) and its active
-- module's running limit, so the claim reads one table. A tenant pause and a queue row created
-- at the same moment (the first enqueue of a new task type, an upload): the new row copies the
-- tenant's state under a FOR SHARE lock of the tenant row (here; the module statements in
-- queue/modules.rs), which waits for a pause in flight and makes a later pause wait for the
-- new row, so the copy is never stale. Only a new row pays for the tenant lock: the first
-- enqueue of a queue, ever.
create or replace function sweep.sweep_wake_queues_locking(p_tenant text[],
                                                           p_task_type text[],
                                                           p_run_at timestamptz[])
returns void
language plpgsql volatile
set search_path = sweep
as $$
declare
    new_tenants text[];
    new_types   text[];
begin
    with created as (
        insert into queues (tenant, task_type, next_run_at, weight, max_running, tenant_paused)
        select w.tenant, w.task_type, w.run_at, coalesce(t.weight, 1), m.max_running,
               t.paused_at is not null
        from unnest(p_tenant, p_task_type, p_run_at) as w(tenant, task_type, run_at)
        left join tenants t on t.name = w.tenant
        left join active_modules a on a.tenant = w.tenant and a.task_type = w.task_type
        left join modules m
               on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
        order by w.tenant, w.task_type
        on conflict (tenant, task_type) do nothing
        returning tenant, task_type
    )
    select array_agg(tenant), array_agg(task_type) into new_tenants, new_types from created;

    if new_tenants is not null then
        -- A fresh look at each tenant under FOR SHARE (each statement here takes a new
        -- snapshot): a pause or weight change committed since the insert read it is seen.
        update queues q set tenant_paused = t.paused_at is not null, weight = t.weight
        from (
            select name, paused_at, weight from tenants
            where name = any(new_tenants)
            order by name
            for share
        ) t,
        unnest(new_tenants, new_types) as n(tenant, task_type)
        where q.tenant = n.tenant and q.task_type = n.task_type and t.name = n.tenant;
    end if;

    perform 1
    from queues q
    join unnest(p_tenant, p_task_type) as w(tenant, task_type)
      on q.tenant = w.tenant and q.task_type = w.task_type
    order by q.tenant, q.task_type
    for key share of q;

    update queues q set next_run_at = l.run_at
    from (
        select q2.ctid, w.run_at
        from queues q2
        join unnest(p_tenant, p_task_type, p_run_at) as w(tenant, task_type, run_at)
          on q2.tenant = w.tenant and q2.task_type = w.task_type
        where q2.next_run_at is null or q2.next_run_at > w.run_at
        order by q2.tenant, q2.task_type
        for no key update of q2 skip locked
    ) l
    where q.ctid = l.ctid;
end
$$;

-- Lowers the hints of the given queues (one entry per distinct queue) to the given times, with
-- one row lock instead of two when it can: every statement that makes tasks wait calls it.
--
-- Why: on an idle queue the hint is null after every claim (the claim found the queue short
-- and cleared it), so taking the KEY SHARE lock and then lowering would take two locks on the
-- same row per single-task enqueue: the KEY SHARE lock writes the row's lock bits (a heap
-- change and a WAL record) and the update writes a new row version. pgbench put that at ~0.45
-- ms of a ~0.8 ms enqueue (statement and commit) on a 2-core machine, against 0.35-0.45 ms for
-- the same statement without it.
--
-- The lowering alone is enough when it succeeds: the update holds the row FOR NO KEY UPDATE
-- until this transaction commits, which conflicts with the FOR UPDATE a claim or the hint
-- repair needs to raise or clear the hint, exactly as KEY SHARE does. So it first tries to
-- lower every queue's hint, skipping rows it cannot lock at once; when that lowered all of
-- them, it is done. Otherwise the rest get the KEY SHARE lock and the fresh look at their hint
-- (a hint already early enough, the common case on a busy queue, needs nothing more), and a
-- hint found late, because another transaction held its row, is lowered by a second pass. A
-- queue with no row yet goes to sweep_wake_queues_locking, which creates it.
create or replace function sweep.sweep_wake_queues(p_tenant text[], p_task_type text[],
                                                   p_run_at timestamptz[])
returns void
language plpgsql volatile
set search_path = sweep
as $$
declare
    -- Callers pass each queue once (one entry per distinct queue of their rows).
    queues  integer := cardinality(p_tenant);
    lowered bigint;
    held    bigint;
    late    bigint;
begin
    -- Two passes at most: a hint the first pass could not lower because another transaction
    -- held its row is lowered by the second, after the KEY SHARE lock waited for that one.
    for pass in 1..2 loop
        with l as (
            update queues q set next_run_at = l.run_at
            from (
                select q2.ctid, w.run_at
                from queues q2
                join unnest(p_tenant, p_task_type, p_run_at) as w(tenant, task_type, run_at)
                  on q2.tenant = w.tenant and q2.task_type = w.task_type
                where q2.next_run_at is null or q2.next_run_at > w.run_at
                order by q2.tenant, q2.task_type
                for no key update of q2 skip locked
            ) l
            where q.ctid = l.ctid
            returning 1
        )
        select count(*) into lowered from l;
        exit when pass = 2 or lowered = queues;

        -- The rest: KEY SHARE (rows lowered above are held already), with a fresh look at
        -- each hint once its row is locked.
        select count(*), count(*) filter (where k.next_run_at is null or k.next_run_at > k.run_at)
        into held, late
        from (
            select q.next_run_at, w.run_at
            from queues q
            join unnest(p_tenant, p_task_type, p_run_at) as w(tenant, task_type, run_at)
              on q.tenant = w.tenant and q.task_type = w.task_type
            order by q.tenant, q.task_type
            for key share of q
        ) k;
        if held < queues then
            -- A queue without a row yet: created, copying its tenant's state, with the rest
            -- done as above.
            perform sweep_wake_queues_locking(p_tenant, p_task_type, p_run_at);
            return;
        end if;
        exit when late = 0;
    end loop;
end
$$;
