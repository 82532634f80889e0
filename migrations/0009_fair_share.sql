-- Fair share: a runner's slots are shared among tenants in proportion to their weight, and
-- within a tenant among its task types, counting slots held (running tasks) across all runners.
--
-- A queue is one (tenant, task_type). `queues` has a row for every queue that ever had work,
-- with `next_run_at`: when its earliest waiting task is due (null: nothing waiting). The claim
-- reads only the queues whose `next_run_at` has passed, so its cost follows the number of
-- queues with due work, never the size of a backlog, and it takes tasks from each chosen queue
-- through `tasks_queue`, an index that starts with the queue.
--
-- `next_run_at` is a hint kept by these rules (the claim is `sweep_claim` at the end):
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

-- Every queue that has tasks or an active module; weights are all 1 at this point.
insert into queues (tenant, task_type, next_run_at)
select k.tenant, k.task_type, min(k.run_at)
from (
    select tenant, task_type, case when state in ('pending', 'retrying') then run_at end
    from tasks
    union all
    select tenant, task_type, null from active_modules
) as k(tenant, task_type, run_at)
group by k.tenant, k.task_type;

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

-- The fair claim: up to p_limit due tasks for runner p_runner, leased for p_lease_ms, shared
-- out among the tenants and task types that have due work. Called once per claim
-- (runner/src/queue/claim.rs): one round trip.
--
-- p_task_types: only these types (empty: all). p_starved: the runner's spare slots, one task
-- each for queues with nothing running on any runner or whose tenant holds less than its share
-- (fewer running tasks per unit of weight than the tenants of the window hold on average). p_ring: where on the ring of queues this
-- claim starts looking (random, drawn by the runner).
--
-- The policy, slot by slot: the next slot goes to the tenant holding the fewest running tasks
-- (across all runners) per unit of weight, ties broken at random; within that tenant, to the
-- task type holding the fewest; within the type, to the task of highest priority, then earliest
-- run_at, then lowest id. Tenant running caps and task type running limits bound each choice.
--
-- Cost: the general statement reads the running tasks once (bounded by the runners' slots) and
-- a window of at most 2 * p_limit + 16 due queues (from `queues`, never from the backlog), then
-- probes each chosen queue's index once. When exactly one queue has due work and nothing limits
-- it (a single-tenant deployment, or one busy type), a statement that takes its tasks directly
-- runs instead: in a function, only the statement that runs pays for its plan.
--
-- Lookups in the general statement go through jsonb objects rather than joins: it is planned
-- once per connection (generic plan), and joins between CTEs came out as nested loops.
--
-- Claims commit asynchronously (synchronous_commit off for the claiming transaction only), see
-- claim.rs.
create function sweep_claim(p_runner uuid, p_limit bigint, p_task_types text[],
                            p_lease_ms bigint, p_starved boolean, p_ring integer)
returns table (id bigint, tenant text, task_type text, payload jsonb, attempt integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz,
               version integer, sha256 text, fuel bigint, timeout_ms bigint,
               memory_bytes bigint, module_max_attempts integer, backoff_base_ms bigint,
               backoff_cap_ms bigint, max_running integer)
language plpgsql volatile as $$
#variable_conflict use_column
declare
    due_queues    bigint;
    only_tenant   text;
    only_type     text;
    limited       boolean;
begin
    if not p_starved then
        select count(*), min(d.tenant), min(d.task_type), bool_or(d.limited)
        into due_queues, only_tenant, only_type, limited
        from (
            select q.tenant, q.task_type,
                   q.max_running is not null
                   or exists (select 1 from tenants t
                              where t.name = q.tenant and t.max_running is not null) as limited
            from queues q
            where q.next_run_at is not null and q.next_run_at <= now()
              and (cardinality(p_task_types) = 0 or q.task_type = any(p_task_types))
            limit 2
        ) d;
        if due_queues = 1 and not limited then
            return query
            with picked as materialized (
                select t.ctid, t.id from tasks t
                where t.tenant = only_tenant and t.task_type = only_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                order by t.priority desc, t.run_at, t.id
                limit p_limit
                for update skip locked
            ),
            -- Fewer due tasks than asked for: correct the hint (as in the general statement;
            -- a claim that took exactly the last ones leaves that to the next claim).
            rehinted as (
                update queues q
                set next_run_at = sweep_queue_next_run_at(q.tenant, q.task_type,
                                                          array(select p.id from picked p))
                from (
                    select q2.ctid from queues q2
                    where q2.tenant = only_tenant and q2.task_type = only_type
                      and (select count(*) from picked) < p_limit
                    for update skip locked
                ) l
                where q.ctid = l.ctid
            ),
            claimed as (
                update tasks t
                set state = 'running',
                    attempts = t.attempts + 1,
                    lease_owner = p_runner,
                    lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
                    started_at = now(),
                    updated_at = now()
                where t.ctid = any(array(select p.ctid from picked p))
                returning t.id, t.tenant, t.task_type, t.payload, t.attempts, t.max_attempts,
                          t.run_at, t.created_at
            )
            select c.id, c.tenant, c.task_type, c.payload, c.attempts, c.max_attempts,
                   c.run_at, c.created_at, m.version, m.sha256, m.fuel, m.timeout_ms,
                   m.memory_bytes, m.max_attempts, m.backoff_base_ms, m.backoff_cap_ms,
                   m.max_running
            from claimed c
            left join active_modules a on a.tenant = c.tenant and a.task_type = c.task_type
            left join modules m
                   on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
            cross join (select set_config('synchronous_commit', 'off', true)) as async_commit;
            return;
        end if;
    end if;

    return query
    with
    -- Slots held right now, per queue and per tenant, across all runners.
    running_by_queue as materialized (
        select tenant, task_type, count(*) as n
        from tasks
        where state = 'running'
        group by tenant, task_type
    ),
    running as materialized (
        select coalesce((select jsonb_object_agg(tenant || '/' || task_type, n)
                         from running_by_queue), '{}') as by_queue,
               coalesce((select jsonb_object_agg(tenant, n)
                         from (select tenant, sum(n) as n from running_by_queue group by tenant) t),
                        '{}') as by_tenant
    ),
    -- The window: due queues from a random point of the ring on, wrapping around.
    sample as materialized (
        select * from (
            (select q.tenant, q.task_type, q.weight, q.max_running from queues q
             where q.next_run_at is not null and q.ring >= p_ring and q.next_run_at <= now()
               and (cardinality(p_task_types) = 0 or q.task_type = any(p_task_types))
             order by q.ring
             limit 2 * p_limit + 16)
            union all
            (select q.tenant, q.task_type, q.weight, q.max_running from queues q
             where q.next_run_at is not null and q.ring < p_ring and q.next_run_at <= now()
               and (cardinality(p_task_types) = 0 or q.task_type = any(p_task_types))
             order by q.ring
             limit 2 * p_limit + 16)
        ) s
        limit 2 * p_limit + 16
    ),
    -- Slots held per unit of weight by the tenants of the window: a tenant below this level
    -- holds less than its share, and its queues may use the spare slots too (p_starved).
    level as materialized (
        select coalesce(sum(t.running) / nullif(sum(t.weight), 0), 0) as per_weight
        from (
            select distinct on (s.tenant) s.weight::float8 as weight,
                   coalesce((r.by_tenant ->> s.tenant)::float8, 0) as running
            from sample s
            cross join running r
            order by s.tenant
        ) t
    ),
    -- How many of this claim's slots each queue could take (its running limit, via a try-lock
    -- like the tenant cap's, see sweep_queue_free_slots).
    queue_room as materialized (
        select s.tenant, s.task_type, s.weight, s.max_running is not null as capped,
               coalesce((r.by_queue ->> (s.tenant || '/' || s.task_type))::int8, 0) as running,
               coalesce((r.by_tenant ->> s.tenant)::int8, 0) as tenant_running,
               case when p_starved then 1::int8
                    when s.max_running is null then p_limit
                    else least(p_limit, sweep_queue_free_slots(s.tenant, s.task_type, s.max_running))
               end as room,
               random() as tie
        from sample s
        cross join running r
        where not p_starved
           or not (r.by_queue ? (s.tenant || '/' || s.task_type))
           or coalesce((r.by_tenant ->> s.tenant)::float8, 0) / s.weight
              < (select per_weight from level)
    ),
    caps as materialized (
        select name, sweep_tenant_free_slots(name, max_running) as free
        from tenants
        where max_running is not null
          and exists (select 1 from queue_room q where q.tenant = tenants.name)
    ),
    -- Per tenant: its weight, slots held, and room (its queues' room, bounded by its cap).
    tenant_room as materialized (
        select q.tenant, max(q.weight)::float8 as weight, max(q.tenant_running)::float8 as running,
               least(sum(q.room)::int8, coalesce(min(c.free), p_limit)) as room,
               random() as tie
        from queue_room q
        left join caps c on c.name = q.tenant
        group by q.tenant
    ),
    -- Slot by slot, as water-filling: the j-th slot a tenant would get in this claim has the key
    -- (running + j - 1) / weight, and the p_limit lowest keys win. Only the p_limit tenants with the lowest
    -- first key can win anything, and when there are p_limit of them no winning key exceeds the
    -- highest of their first keys, which bounds how many keys each one needs.
    top_tenants as materialized (
        select * from tenant_room
        where room > 0
        order by running / weight, weight desc, tie
        limit p_limit
    ),
    kth as (
        select case when count(*) >= p_limit then max(running / weight) end as key from top_tenants
    ),
    tenant_tickets as (
        select t.tenant, (t.running + j - 1) / t.weight as key, t.weight, t.tie, j
        from top_tenants t
        cross join kth
        cross join lateral generate_series(
            1::int8,
            least(t.room, coalesce(floor(kth.key * t.weight - t.running + 1e-9)::int8 + 1, t.room))
        ) as j
    ),
    tenant_alloc as materialized (
        select jsonb_object_agg(tenant, slots) as slots
        from (
            select tenant, count(*) as slots
            from (select tenant from tenant_tickets order by key, weight desc, tie, j limit p_limit) best
            group by tenant
        ) a
    ),
    -- The same within each tenant, among its task types (equal weights).
    queue_tickets as (
        select q.tenant, q.task_type, s.slots,
               row_number() over (partition by q.tenant order by q.running + j, q.tie, j) as rank
        from queue_room q
        cross join tenant_alloc a
        cross join lateral (select (a.slots ->> q.tenant)::int8 as slots) s
        cross join lateral generate_series(1::int8, least(q.room, s.slots)) as j
        where a.slots ? q.tenant
    ),
    -- Each chosen queue's tasks in priority order, locked; another claimer's rows are skipped.
    -- `more`: whether anything else of the queue is due (looked at, not locked); when not, the
    -- queue has run dry and its hint is corrected below.
    picked as materialized (
        select a.tenant, a.task_type, a.want, m.more, p.ctids, p.ids
        from (
            select tenant, task_type, count(*) as want
            from queue_tickets
            where rank <= slots
            group by tenant, task_type
        ) a
        cross join lateral (
            select array_agg(t.ctid) as ctids, array_agg(t.id) as ids
            from (
                select t.ctid, t.id from tasks t
                where t.tenant = a.tenant and t.task_type = a.task_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                order by t.priority desc, t.run_at, t.id
                limit a.want
                for update skip locked
            ) t
        ) p
        cross join lateral (
            select exists (
                select 1 from tasks t
                where t.tenant = a.tenant and t.task_type = a.task_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                  and t.id <> all(coalesce(p.ids, '{}'))
            ) as more
        ) m
    ),
    picked_ids as materialized (
        select coalesce(array_agg(id), '{}') as ids,
               coalesce(array_agg(ctid), '{}') as ctids
        from picked, unnest(ids, ctids) as u(id, ctid)
    ),
    -- Work-conserving: slots a queue could not fill (fewer due tasks than its share, or rows
    -- locked by another claimer) go to other uncapped queues of the window, least served first.
    filled as materialized (
        select f.ctid
        from (
            select q.tenant, q.task_type from queue_room q
            where not p_starved and not q.capped
              and not exists (select 1 from caps c where c.name = q.tenant)
              and (select cardinality(ids) from picked_ids) < p_limit
            order by q.tenant_running / q.weight, q.running, q.tie
            limit 4
        ) q
        cross join picked_ids p
        cross join lateral (
            select t.ctid from tasks t
            where t.tenant = q.tenant and t.task_type = q.task_type
              and t.state in ('pending', 'retrying') and t.run_at <= now()
              and t.id <> all(p.ids)
            order by t.priority desc, t.run_at, t.id
            limit p_limit
            for update skip locked
        ) f
        limit greatest(p_limit - (select cardinality(ids) from picked_ids), 0)
    ),
    -- A queue this claim emptied of due work: look again under FOR UPDATE (which waits for
    -- no one and is refused while an enqueue to it is in flight, see 0009_fair_share.sql) and move
    -- its hint to its next waiting task, or clear it.
    rehinted as (
        update queues q
        set next_run_at = sweep_queue_next_run_at(q.tenant, q.task_type, l.ids)
        from (
            select q2.ctid, i.ids from queues q2
            cross join picked_ids i
            join picked p on p.tenant = q2.tenant and p.task_type = q2.task_type
            where not p.more
            order by q2.tenant, q2.task_type
            for update of q2 skip locked
        ) l
        where q.ctid = l.ctid
    ),
    -- By ctid: the very row versions locked above (a TID scan, no second index lookup).
    claimed as (
        update tasks t
        set state = 'running',
            attempts = t.attempts + 1,
            lease_owner = p_runner,
            lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
            started_at = now(),
            updated_at = now()
        where t.ctid = any(array(select unnest(ctids) from picked_ids union all select ctid from filled))
        returning t.id, t.tenant, t.task_type, t.payload, t.attempts, t.max_attempts,
                  t.run_at, t.created_at
    )
    select c.id, c.tenant, c.task_type, c.payload, c.attempts as attempt, c.max_attempts,
           c.run_at, c.created_at, m.version, m.sha256, m.fuel, m.timeout_ms,
           m.memory_bytes, m.max_attempts as module_max_attempts, m.backoff_base_ms,
           m.backoff_cap_ms, m.max_running
    from claimed c
    left join active_modules a on a.tenant = c.tenant and a.task_type = c.task_type
    left join modules m
           on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
    cross join (select set_config('synchronous_commit', 'off', true)) as async_commit;
end
$$;
