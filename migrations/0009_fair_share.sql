-- Fair share: a runner's slots are shared among tenants in proportion to their weight, and
-- within a tenant among its task types, counting slots held (running tasks) across all runners.
--
-- A queue is one (tenant, task_type). `queues` has a row for every queue that ever had work,
-- with `next_run_at`: when its earliest waiting task is due (null: nothing waiting). The claim
-- reads only the queues whose `next_run_at` has passed, so its cost follows the number of
-- queues with due work, never the size of a backlog, and it takes tasks from each chosen queue
-- through `tasks_queue`, an index that starts with the queue.
--
-- `next_run_at` is a hint kept by these rules (see runner/src/queue/claim.rs):
--   lowered  by whoever makes a task wait (enqueue, retry, release, requeue), through
--            sweep_wake_queues: it holds the row FOR KEY SHARE until it commits, then lowers
--            the hint if it is null or later;
--   raised   (or cleared) only by a claim that found the queue short of due work, and by the
--            runners' hint repair, each under FOR UPDATE SKIP LOCKED and with a fresh look at
--            the queue taken after the lock (sweep_queue_next_run_at). FOR UPDATE conflicts
--            with KEY SHARE, so a hint is never raised past a task whose enqueue is in flight;
--            a raise that cannot get the lock is skipped, which only leaves the hint early.
-- A hint that is early costs one probe that finds nothing; a hint that is late (a lowering
-- that skipped a row another writer was lowering at that moment) is repaired by the runners'
-- maintenance within its interval.

create table queues (
    tenant      text        not null,
    task_type   text        not null,
    next_run_at timestamptz,
    -- Copies, so the claim reads one table: the tenant's weight (tenants.weight) and the
    -- active module's running limit (modules.max_running). Written by set_tenant_weight and
    -- by module activation; a new queue row copies both.
    weight      integer     not null default 1,
    max_running integer,
    -- A random position on a ring: each claim looks at a bounded window of due queues starting
    -- at a random point, so with thousands of due queues every one is looked at within a few
    -- claims and no claim reads them all.
    ring        integer     not null default floor(random() * 2147483647)::integer,
    primary key (tenant, task_type)
);

-- The claim's window: due queues in ring order; next_run_at in the index, so queues whose
-- hint is still in the future are passed over without a heap visit.
create index queues_due on queues (ring, next_run_at) where next_run_at is not null;

-- How much of the runners' slots a tenant's backlog gets, relative to other backlogged tenants.
alter table tenants add column weight integer not null default 1;
alter table tenants add constraint tenants_weight_range check (weight between 1 and 10000);

-- Most tasks of one task type running at once across all runners (null: no limit).
alter table modules add column max_running integer;
alter table modules add constraint modules_max_running_positive
    check (coalesce(max_running, 1) >= 1);
drop index modules_identity;
create unique index modules_identity
    on modules (tenant, task_type, sha256, fuel, timeout_ms, memory_bytes, max_attempts,
                backoff_base_ms, backoff_cap_ms, max_running) nulls not distinct;

-- Claims go queue by queue now; the global claim order is gone.
drop index tasks_claim;
create index tasks_queue on tasks (tenant, task_type, priority desc, run_at, id)
    where state in ('pending', 'retrying');

insert into queues (tenant, task_type, next_run_at, weight)
select k.tenant, k.task_type, k.next_run_at, coalesce(t.weight, 1)
from (
    select tenant, task_type, min(run_at) filter (where state in ('pending', 'retrying'))
    from tasks
    group by tenant, task_type
    union
    select tenant, task_type, null from active_modules
) as k(tenant, task_type, next_run_at)
left join tenants t on t.name = k.tenant
on conflict (tenant, task_type)
    do update set next_run_at = least(queues.next_run_at, excluded.next_run_at);

-- Makes sure each queue has a row and its hint is no later than the given time. One call per
-- statement that makes tasks wait, with one entry per distinct queue.
--
-- The KEY SHARE lock is what makes clearing safe: a claim clears a hint only under FOR UPDATE,
-- which waits for no one (SKIP LOCKED) and is refused while any writer that may have added a
-- task holds KEY SHARE; once this transaction commits, its tasks are visible to the fresh look
-- the next clear takes. Two writers lowering the same hint at once: the second skips (its task
-- is no earlier than the first's in the common case; the hint repair covers the rest).
create function sweep_wake_queues(p_tenant text[], p_task_type text[], p_run_at timestamptz[])
returns void language plpgsql volatile as $$
begin
    insert into queues (tenant, task_type, next_run_at, weight, max_running)
    select w.tenant, w.task_type, w.run_at, coalesce(t.weight, 1), m.max_running
    from unnest(p_tenant, p_task_type, p_run_at) as w(tenant, task_type, run_at)
    left join tenants t on t.name = w.tenant
    left join active_modules a on a.tenant = w.tenant and a.task_type = w.task_type
    left join modules m
           on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
    order by w.tenant, w.task_type
    on conflict (tenant, task_type) do nothing;

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

-- When the earliest waiting task of a queue is due, leaving out `p_exclude` (tasks the
-- calling claim is taking right now); null when nothing waits. One index probe per distinct
-- priority in the queue, however long its backlog. VOLATILE: every query here takes a fresh
-- snapshot, so a caller holding the queue row FOR UPDATE sees every enqueue committed before.
create function sweep_queue_next_run_at(p_tenant text, p_task_type text, p_exclude bigint[])
returns timestamptz language plpgsql volatile as $$
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

-- How many more tasks of queue (`p_tenant`, `p_task_type`) may start now, given its module's
-- `max_running`; 0 when another runner is claiming for this queue right now (try-lock, as in
-- sweep_tenant_free_slots, whose reasoning about snapshots applies here too).
create function sweep_queue_free_slots(p_tenant text, p_task_type text, p_max integer)
returns integer language plpgsql volatile strict as $$
declare
    running integer;
begin
    -- 1937204593 = 'swep' + 1: the queue lock key space, next to the tenant one.
    if not pg_try_advisory_xact_lock(1937204593, hashtext(p_tenant || '/' || p_task_type)) then
        return 0;
    end if;
    select count(*) into running from tasks
    where state = 'running' and tenant = p_tenant and task_type = p_task_type;
    return greatest(p_max - running, 0);
end
$$;
