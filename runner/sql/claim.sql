-- The claim: which due tasks a runner takes, whose, and how they become `running`.
--
-- Called once per claim from runner/src/queue/claim.rs, one round trip:
--   sweep_claim_from  a claim lane's fair claim: the one-queue claim below when exactly one
--                     queue is due and nothing limits it, else sweep_claim;
--   sweep_claim       the general claim, and the spare slots' claim (p_starved).
--
-- The policy, slot by slot: the next slot goes to the tenant holding the fewest running tasks
-- (across all runners) per unit of weight, ties broken by a lottery weighted by weight; within
-- that tenant, to the task type holding the fewest; within the type, to the task of highest
-- priority, then earliest run_at, then lowest id. Tenant running caps, task type running limits
-- and rate limits bound each choice.
--
-- A queue is one (tenant, task_type) with a row in `queues` (see wake_queues.sql): the claim
-- reads only queues whose hint `next_run_at` has passed and that are not paused (the window's
-- index, `queues_due`, leaves paused ones out), so its cost follows the number of queues with
-- due work, never the size of a backlog, and it takes each chosen queue's tasks through
-- `tasks_queue`, an index that starts with the queue. A queue this claim empties of due work
-- gets its hint corrected in the same statement.
--
-- Every claim function carries the planner settings it was written for: plans made once per
-- connection and kept (no re-planning per call), never a seq or bitmap scan of a backlog
-- however the statistics looked when the plan was made, and no JIT (which pricing paths out
-- would otherwise trigger, and which never pays for statements this short). Claims commit
-- asynchronously (synchronous_commit off for the claiming transaction only, see claim.rs).
--
-- The parts, in the order a claim meets them: the running limits (try-locks), the one-queue
-- claim with its cursor (sweep_claim_from), and the general claim (sweep_claim): choosing due
-- queues (sweep_claim_window), sharing out free slots, picking and updating rows.


-- How many more tasks tenant `p_tenant` may start now, given its cap `p_max`.
--
-- Claims of one capped tenant are serialised by a transaction-scoped advisory lock, taken with
-- try-lock: when another runner is claiming for this tenant right now, the answer is 0 and
-- this claim skips the tenant (as SKIP LOCKED skips a locked row) instead of waiting, so
-- claimers never block or deadlock on each other. The lock is held until the claiming
-- transaction commits.
--
-- VOLATILE on purpose: a volatile function takes a fresh snapshot for each query it runs (in
-- READ COMMITTED, the default), so the count below sees every claim committed before the lock
-- was granted, even those committed after the calling statement started.
create or replace function sweep.sweep_tenant_free_slots(p_tenant text, p_max integer)
returns integer
language plpgsql volatile strict
set search_path = sweep
as $$
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

-- How many more tasks of queue (`p_tenant`, `p_task_type`) may start now, given its module's
-- `max_running`; 0 when another runner is claiming for this queue right now (try-lock, as in
-- sweep_tenant_free_slots, whose reasoning about snapshots applies here too).
create or replace function sweep.sweep_queue_free_slots(p_tenant text, p_task_type text,
                                                        p_max integer)
returns integer
language plpgsql volatile strict
set search_path = sweep
as $$
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


-- Whether a spare slot (p_starved) may go to queue (p_tenant, p_task_type), which held
-- `p_running` tasks in the claiming statement's snapshot. Two runners' spare-slot claims at
-- the same moment would both see a newly due queue with nothing running and each give it a
-- slot; so the queue's try-lock (the key space of sweep_queue_free_slots) is taken first, and
-- the running tasks counted again with a fresh snapshot (VOLATILE, as there): a claim in
-- flight for the queue holds the lock (no slot here), and one that committed since this
-- statement's snapshot shows in the count (no slot either, unless its tasks already ended).
create or replace function sweep.sweep_queue_spare(p_tenant text, p_task_type text,
                                                   p_running bigint)
returns boolean
language plpgsql volatile strict
set search_path = sweep
as $$
declare
    running bigint;
begin
    if not pg_try_advisory_xact_lock(1937204593, hashtext(p_tenant || '/' || p_task_type)) then
        return false;
    end if;
    select count(*) into running from tasks
    where state = 'running' and tenant = p_tenant and task_type = p_task_type;
    return running <= p_running;
end
$$;

-- A claim lane's fair claim, starting where the lane's last claim from the same queue ended.
--
-- Why a cursor: a claim scans `tasks_queue` from the head of its queue. Every task claimed
-- since the last vacuum left an entry there (its row version before the claim), and every
-- claim walks past all of them before it reaches a due task: `perf` put that walk at 20-30%
-- of Postgres's samples in pgbench runs of the claim between vacuums. A claimer that remembers
-- the key (priority, run_at, id) of the last task it claimed starts its scan there instead,
-- and walks only what other claimers took since its own last claim.
--
-- The cursor is the claimer's, passed in and never stored: nothing is written per claim and
-- claimers do not contend on a shared row. It is a hint for the scan order, not a filter;
-- the queue's key space is scanned in four ranges, in this order, until the claim is full:
--   1. priority above the cursor's  (a more urgent task enqueued since: still first; the
--                                    range is empty in the common case and costs one descent)
--   2. the cursor's priority, after the cursor
--   3. the cursor's priority, up to the cursor (stragglers: a task that became due behind the
--                                    cursor, e.g. enqueued by a transaction that started
--                                    earlier, released, or rescued with its old run_at)
--   4. priority below the cursor's
-- so no due task is ever skipped: a straggler is taken once range 2 is exhausted, or sooner by
-- a claim without a cursor, which the runner sends at least once a second per claim lane
-- (`ClaimCursor` in runner/src/queue/claim.rs). Within a priority the order is therefore
-- first-come-first-served up to that bound, as it is up to SKIP LOCKED anyway.
--
-- Only the one-queue claim (exactly one due queue, no limits: a runner draining one task type,
-- a single-tenant deployment) uses a cursor; a claim without one, or with another queue's,
-- starts at the queue's head. In a function only the statement that runs pays for its plan,
-- so this claim, which takes its tasks directly, costs nothing of the general claim. It looks
-- the queue's active module up once per claim, not per row, and returns the priorities the
-- claimer's next cursor is made of. Every other claim is sweep_claim's, whose rows come back
-- with a null priority, which tells the claimer to drop its cursor.
create or replace function sweep.sweep_claim_from(p_runner uuid, p_limit bigint,
                                                  p_task_types text[], p_lease_ms bigint,
                                                  p_ring integer, p_cursor_tenant text,
                                                  p_cursor_type text, p_cursor_priority integer,
                                                  p_cursor_run_at timestamptz,
                                                  p_cursor_id bigint)
returns table (id bigint, tenant text, task_type text, payload jsonb, attempt integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz,
               version integer, sha256 text, fuel bigint, timeout_ms bigint,
               memory_bytes bigint, module_max_attempts integer, backoff_base_ms bigint,
               backoff_cap_ms bigint, max_running integer, priority integer)
language plpgsql volatile
set search_path = sweep
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
#variable_conflict use_column
declare
    due_queues    bigint;
    only_tenant   text;
    only_type     text;
    limited       boolean;
    -- The cursor if it is this queue's, else the key before every task (the highest priority,
    -- the earliest time, the lowest id): from there the ranges below are the queue's order
    -- from its head (range 2 holds the tasks of the highest priority, range 4 the rest).
    at_priority   integer     := 2147483647;
    at_run_at     timestamptz := '-infinity';
    at_id         bigint      := -9223372036854775808;
begin
    -- One due queue, and nothing that limits it (a running limit, a rate limit, a tenant cap)?
    select count(*), min(d.tenant), min(d.task_type), bool_or(d.limited)
    into due_queues, only_tenant, only_type, limited
    from (
        select q.tenant, q.task_type,
               q.max_running is not null or q.rate_per_sec is not null
               or exists (select 1 from tenants t
                          where t.name = q.tenant and t.max_running is not null) as limited
        from queues q
        where q.next_run_at is not null and not q.paused and q.next_run_at <= now()
          and (cardinality(p_task_types) = 0 or q.task_type = any(p_task_types))
        limit 2
    ) d;
    if due_queues <> 1 or limited then
        return query
        select c.*, null::integer
        from sweep_claim(p_runner, p_limit, p_task_types, p_lease_ms, false, p_ring) c;
        return;
    end if;

    if only_tenant = p_cursor_tenant and only_type = p_cursor_type then
        at_priority := p_cursor_priority;
        at_run_at := p_cursor_run_at;
        at_id := p_cursor_id;
    end if;
    return query
    -- The ranges in order, each a subquery of its own (FOR UPDATE is not allowed on a UNION).
    -- The append runs them one after another and stops as soon as the claim is full: a range
    -- after the one that filled it is never scanned, and rows are locked only as they are
    -- taken.
    with picked as materialized (
        select u.ctid, u.id from (
            -- 1. more urgent than the cursor
            select * from (
                select t.ctid, t.id from tasks t
                where t.tenant = only_tenant and t.task_type = only_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                  and t.priority > at_priority
                order by t.priority desc, t.run_at, t.id
                limit p_limit
                for update skip locked
            ) r1
            union all
            -- 2. after the cursor
            select * from (
                select t.ctid, t.id from tasks t
                where t.tenant = only_tenant and t.task_type = only_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                  and t.priority = at_priority
                  and (t.run_at, t.id) > (at_run_at, at_id)
                order by t.priority desc, t.run_at, t.id
                limit p_limit
                for update skip locked
            ) r2
            union all
            -- 3. stragglers, up to the cursor
            select * from (
                select t.ctid, t.id from tasks t
                where t.tenant = only_tenant and t.task_type = only_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                  and t.priority = at_priority
                  and (t.run_at, t.id) <= (at_run_at, at_id)
                order by t.priority desc, t.run_at, t.id
                limit p_limit
                for update skip locked
            ) r3
            union all
            -- 4. less urgent than the cursor
            select * from (
                select t.ctid, t.id from tasks t
                where t.tenant = only_tenant and t.task_type = only_type
                  and t.state in ('pending', 'retrying') and t.run_at <= now()
                  and t.priority < at_priority
                order by t.priority desc, t.run_at, t.id
                limit p_limit
                for update skip locked
            ) r4
        ) u
        limit p_limit
    ),
    -- Fewer due tasks than asked for: the queue may have run dry, so its hint is corrected
    -- under FOR UPDATE (see wake_queues.sql). A claim that took exactly the last ones leaves
    -- that to the next claim.
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
    -- By ctid: the very row versions locked above (a TID scan, no second index lookup).
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
                  t.run_at, t.created_at, t.priority
    ),
    -- Every claimed task is of the one queue: its active module is looked up once, not joined
    -- to each row (two index probes a task, a fifth of this statement on a claim of 250).
    active as materialized (
        select m.version, m.sha256, m.fuel, m.timeout_ms, m.memory_bytes,
               m.max_attempts, m.backoff_base_ms, m.backoff_cap_ms, m.max_running
        from active_modules a
        join modules m
          on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
        where a.tenant = only_tenant and a.task_type = only_type
    )
    select c.id, c.tenant, c.task_type, c.payload, c.attempts, c.max_attempts,
           c.run_at, c.created_at, m.version, m.sha256, m.fuel, m.timeout_ms,
           m.memory_bytes, m.max_attempts, m.backoff_base_ms, m.backoff_cap_ms,
           m.max_running, c.priority
    from claimed c
    left join active m on true
    cross join (select set_config('synchronous_commit', 'off', true)) as async_commit;
end
$$;


-- Choosing due queues: the general claim's window, at most `p_size` due queues that are not
-- paused, from point `p_ring` of the ring on, wrapping around. Each queue row holds a random
-- position on the ring (`queues.ring`), so with thousands of due queues every one is looked
-- at within a few claims and no claim reads them all. `p_task_types` empty: every type.
--
-- A plain SQL query, STABLE, without settings of its own: Postgres inlines it into the
-- calling statement, which plans it as if it were written there (under the caller's settings).
create or replace function sweep.sweep_claim_window(p_ring integer, p_size bigint,
                                                    p_task_types text[])
returns table (tenant text, task_type text, weight integer, max_running integer,
               rate_per_sec float8)
language sql stable
as $$
    select * from (
        (select q.tenant, q.task_type, q.weight, q.max_running, q.rate_per_sec
         from sweep.queues q
         where q.next_run_at is not null and not q.paused and q.ring >= p_ring
           and q.next_run_at <= now()
           and (cardinality(p_task_types) = 0 or q.task_type = any(p_task_types))
         order by q.ring
         limit p_size)
        union all
        (select q.tenant, q.task_type, q.weight, q.max_running, q.rate_per_sec
         from sweep.queues q
         where q.next_run_at is not null and not q.paused and q.ring < p_ring
           and q.next_run_at <= now()
           and (cardinality(p_task_types) = 0 or q.task_type = any(p_task_types))
         order by q.ring
         limit p_size)
    ) s
    limit p_size
$$;

-- The general claim: up to p_limit due tasks for runner p_runner, leased for p_lease_ms,
-- shared out among the tenants and task types of a window of due queues.
--
-- p_task_types: only these types (empty: all). p_starved: the runner's spare slots, one task
-- each for queues with nothing running on any runner or whose tenant holds less than its
-- share (fewer running tasks per unit of weight than the tenants of the window hold on
-- average), each admitted under the queue's try-lock with a fresh look (sweep_queue_spare), so
-- two runners' spare slots never go to the same queue on the same state. p_ring: where on the
-- ring of queues this claim starts looking (random, drawn by the runner).
--
-- Cost: the statement reads a window of at most p_limit + 16 due queues (never the backlog)
-- and the running tasks of the tenants it shares among (one index range per queue), shares
-- the slots among all of the window or, when it is crowded, among its first p_limit / 4 + 16,
-- then probes each chosen queue's index once and looks its module up once. Sets of rows are
-- brought together by grouping or window functions over their union or by lookups per row
-- through an index, never by joins of CTEs (the statement is planned once per connection, and
-- such joins come out as nested loops in a generic plan) nor by lookups in objects built per
-- claim; so nothing but the window's sorts grows with the tenants holding slots.
create or replace function sweep.sweep_claim(p_runner uuid, p_limit bigint, p_task_types text[],
                                             p_lease_ms bigint, p_starved boolean,
                                             p_ring integer)
returns table (id bigint, tenant text, task_type text, payload jsonb, attempt integer,
               max_attempts integer, run_at timestamptz, created_at timestamptz,
               version integer, sha256 text, fuel bigint, timeout_ms bigint,
               memory_bytes bigint, module_max_attempts integer, backoff_base_ms bigint,
               backoff_cap_ms bigint, max_running integer)
language plpgsql volatile
set search_path = sweep
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
set enable_bitmapscan = off
set jit = off
as $$
#variable_conflict use_column
begin
    return query
    with
    ---- Choosing due queues, and what each could take.

    sample as materialized (
        select w.*, row_number() over () as rn
        from sweep_claim_window(p_ring, p_limit + 16, p_task_types) w
    ),
    -- The queues the slots are shared among: the whole window, or, when it is crowded (at
    -- least p_limit due queues, so that most would get one slot or none), its first
    -- p_limit / 4 + 16 in ring order. Sharing out costs per queue shared among (the running
    -- counts grouped with it, the tickets, a probe, a lock and a look for more per queue
    -- served); among a quarter as many queues each winner takes about 4 slots, and the ring's
    -- random start spreads the winners across claims. The rest of the window fills what the
    -- head leaves (below), so a crowded claim of queues with one or two due tasks each is full.
    head as materialized (
        select s.* from sample s
        where s.rn <= case when (select count(*) from sample) >= p_limit then p_limit / 4 + 16
                           else p_limit + 16 end
    ),
    -- Each queue of the head with the slots it holds and its tenant holds, across all runners,
    -- counted in `tasks_running` (running tasks by queue): one index range per queue, over
    -- its tenant's running tasks only. Grouping every running task with the window instead
    -- (no index for it then) read them all, per claim: the largest part of choosing at 1,000
    -- due tenants with 1,000 running. A tenant with several queues in the head has its running
    -- tasks read once per queue (one queue, one read, in the common case).
    --
    -- `tenant_queues`: how many queues of the head the tenant has. Sorts by tenant name
    -- compare bytes (collate "C"): any consistent order groups a tenant's rows, and it spares
    -- each comparison the database collation.
    counted as materialized (
        select s.tenant, s.task_type, s.weight, s.max_running, s.rate_per_sec, r.running,
               r.tenant_running,
               (count(*) over (partition by s.tenant collate "C"))::int4 as tenant_queues
        from head s
        cross join lateral (
            select (count(*) filter (where t.task_type = s.task_type))::int8 as running,
                   count(*)::int8 as tenant_running
            from tasks t
            where t.state = 'running' and t.tenant = s.tenant
        ) r
    ),
    -- The buckets of the window's rate-limited queues, locked (see flow_tokens.sql). Never run
    -- when no queue of the window has a rate limit (nothing refers to it then).
    tokens as materialized (
        select s.tenant, s.task_type, b.available, b.at
        from head s
        cross join lateral sweep_queue_tokens(s.tenant, s.task_type) b
        where s.rate_per_sec is not null
    ),
    -- Slots held per unit of weight by the tenants of the window: a tenant below this level
    -- holds less than its share, and its queues may use the spare slots too (p_starved).
    level as materialized (
        select coalesce(sum(t.running) / nullif(sum(t.weight), 0), 0) as per_weight
        from (
            select distinct on (c.tenant collate "C") c.weight::float8 as weight,
                   c.tenant_running::float8 as running
            from counted c
            order by c.tenant collate "C"
        ) t
    ),
    -- How many of this claim's slots each queue could take: its running limit (via a try-lock
    -- like the tenant cap's, see sweep_queue_free_slots) and, rate-limited, its whole tokens.
    queue_room as materialized (
        select c.tenant, c.task_type, c.weight,
               c.max_running is not null or c.rate_per_sec is not null as capped,
               c.rate_per_sec is not null as rated,
               c.running, c.tenant_running, c.tenant_queues,
               least(
                   case when p_starved then 1::int8
                        when c.max_running is null then p_limit
                        else least(p_limit, sweep_queue_free_slots(c.tenant, c.task_type, c.max_running))
                   end,
                   -- The epsilon absorbs the float error of the refill, never a whole token.
                   case when c.rate_per_sec is null then p_limit
                        else coalesce((select floor(b.available + 1e-9)::int8 from tokens b
                                       where b.tenant = c.tenant and b.task_type = c.task_type),
                                      p_limit)
                   end
               ) as room,
               random() as tie
        from counted c
        where not p_starved
           or ((c.running = 0
                or c.tenant_running::float8 / c.weight < (select per_weight from level))
               and sweep_queue_spare(c.tenant, c.task_type, c.running))
    ),
    caps as materialized (
        select name, sweep_tenant_free_slots(name, max_running) as free
        from tenants
        where max_running is not null
          and exists (select 1 from queue_room q where q.tenant = tenants.name)
    ),

    ---- Sharing out free slots.

    -- Per tenant: its weight, slots held, and room (its queues' room, bounded by its cap).
    --
    -- `tie` orders tenants at the same level: an exponential race (-ln U / weight), in which a
    -- tenant's chance to come first is its share of the weights. With more tenants than slots
    -- most of them hold nothing, all at level 0, and the tie alone decides who is served: an
    -- even draw would give weights no effect there, and heavier-first starves the lighter ones
    -- (the weight-2 half of 1,000 backlogged tenants held 98% of the slots).
    tenant_room as materialized (
        select q.tenant, max(q.weight)::float8 as weight, max(q.tenant_running)::float8 as running,
               least(sum(q.room)::int8, coalesce(min(c.free), p_limit)) as room,
               -ln(1.0 - random()) / max(q.weight) as tie,
               -- A tenant with one queue in the window (the usual case): its slots are that
               -- queue's, with no sharing among task types to do.
               min(q.tenant_queues) as queues, min(q.task_type) as only_type,
               bool_or(q.rated) as rated
        from queue_room q
        left join caps c on c.name = q.tenant
        group by q.tenant
    ),
    -- Slot by slot, as water-filling: the j-th slot a tenant would get in this claim has the
    -- key (running + j - 1) / weight, and the p_limit lowest keys win. Only the p_limit tenants
    -- with the lowest first key can win anything, and when there are p_limit of them no winning
    -- key exceeds the highest of their first keys, which bounds how many keys each one needs.
    -- With fewer tenants, the level that gives out p_limit slots is at most the highest first
    -- key + p_limit / (their weights' sum), which bounds them likewise (without it, 100
    -- tenants generated p_limit keys each, 25,000 to sort for a claim of 250). A tenant whose
    -- room stops it below that level leaves slots the bound did not give to the others; the
    -- work-conserving fill below takes them.
    top_tenants as materialized (
        select * from tenant_room
        where room > 0
        order by running / weight, tie
        limit p_limit
    ),
    kth as (
        select case when count(*) >= p_limit then max(running / weight)
                    else max(running / weight) + p_limit / sum(weight) end as key
        from top_tenants
    ),
    tenant_tickets as (
        select t.tenant, (t.running + j - 1) / t.weight as key, t.weight, t.tie, j, t.queues,
               t.only_type, t.rated
        from top_tenants t
        cross join kth
        cross join lateral generate_series(
            1::int8,
            least(t.room, coalesce(floor(kth.key * t.weight - t.running + 1e-9)::int8 + 1, t.room))
        ) as j
    ),
    best as materialized (
        select tenant, queues, only_type, rated
        from tenant_tickets
        order by key, tie, j
        limit p_limit
    ),
    -- The slots of each tenant with several queues in the window, to share among them.
    tenant_alloc as materialized (
        select tenant, count(*) as slots from best where queues > 1 group by tenant
    ),
    -- Each queue with its tenant's slots, brought over by a window function over both sets of
    -- rows (no join, as in `counted`).
    queue_slots as materialized (
        select w.* from (
            select u.tenant, u.task_type, u.rated, u.running, u.room, u.tie,
                   max(u.slots) over (partition by u.tenant collate "C") as slots
            from (
                select q.tenant, q.task_type, q.rated, q.running, q.room, q.tie,
                       null::int8 as slots
                from queue_room q
                where q.tenant_queues > 1
                union all
                select a.tenant, null, null, null, null, null, a.slots
                from tenant_alloc a
            ) u
        ) w
        where w.task_type is not null and w.slots is not null
    ),
    -- The same within each tenant, among its task types (equal weights).
    queue_tickets as (
        select q.tenant, q.task_type, q.rated, q.slots,
               row_number() over (partition by q.tenant collate "C" order by q.running + j, q.tie, j)
                   as rank
        from queue_slots q
        cross join lateral generate_series(1::int8, least(q.room, q.slots)) as j
    ),

    ---- Picking and updating rows.

    -- Each chosen queue's tasks in priority order, locked; another claimer's rows are skipped.
    -- `more`: whether anything else of the queue is due (looked at, not locked); when not, the
    -- queue has run dry and its hint is corrected below.
    picked as materialized (
        select a.tenant, a.task_type, a.rated, a.want, m.more, p.ctids, p.ids
        from (
            select tenant, only_type as task_type, bool_or(rated) as rated, count(*) as want
            from best
            where queues = 1
            group by tenant, only_type
            union all
            select tenant, task_type, bool_or(rated) as rated, count(*) as want
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
        select coalesce(array_agg(id), '{}') as ids
        from picked, unnest(ids) as u(id)
    ),
    -- Work-conserving: slots a queue could not fill (fewer due tasks than its share, or rows
    -- locked by another claimer) go to other uncapped queues: up to 4 of those shared among,
    -- least served first, then the rest of a crowded window in ring order, as many as it takes
    -- (the probes stop once the claim is full; the append runs its parts in order).
    filled as materialized (
        select q.tenant, q.task_type, f.ctid, f.id
        from (
            (select q.tenant, q.task_type from queue_room q
             where not p_starved and not q.capped
               and not exists (select 1 from caps c where c.name = q.tenant)
               and (select cardinality(ids) from picked_ids) < p_limit
             order by q.tenant_running / q.weight, q.running, q.tie
             limit 4)
            union all
            (select s.tenant, s.task_type from sample s
             where not p_starved and s.rn > (select count(*) from head)
               and s.max_running is null and s.rate_per_sec is null
               and not exists (select 1 from tenants t
                               where t.name = s.tenant and t.max_running is not null)
               and (select cardinality(ids) from picked_ids) < p_limit
             order by s.rn)
        ) q
        cross join picked_ids p
        cross join lateral (
            select t.ctid, t.id from tasks t
            where t.tenant = q.tenant and t.task_type = q.task_type
              and t.state in ('pending', 'retrying') and t.run_at <= now()
              and t.id <> all(p.ids)
            order by t.priority desc, t.run_at, t.id
            limit p_limit
            for update skip locked
        ) f
        limit greatest(p_limit - (select cardinality(ids) from picked_ids), 0)
    ),
    -- Every task this claim takes.
    taken as materialized (
        select p.ids || coalesce((select array_agg(f.id) from filled f), '{}') as ids
        from picked_ids p
    ),
    -- A queue this claim emptied of due work, or filled from (which may have emptied it): look
    -- again under FOR UPDATE (which waits for no one and is refused while an enqueue to it is
    -- in flight, see wake_queues.sql) and move its hint to its next waiting task, or clear it.
    --
    -- Each such queue row is found by its key, in a lateral subquery of its own: a join of
    -- `picked` with `queues` was planned as a hash or merge join over every queue row, a cost
    -- per claim that grew with the queues in the table (10,000 tenants: 10,000 rows read by
    -- every claim that emptied a queue).
    rehinted as (
        update queues q
        set next_run_at = n.next_run_at
        from (
            select array_agg(r.ctid) as ctids, array_agg(p.tenant) as tenants,
                   array_agg(p.task_type) as task_types
            from (select p.tenant, p.task_type from picked p
                  where not p.more and not p.rated
                  union
                  select f.tenant, f.task_type from filled f
                  order by 1, 2) p
            cross join lateral (
                select q2.ctid from queues q2
                where q2.tenant = p.tenant and q2.task_type = p.task_type
                for update skip locked
            ) r
        ) l
        cross join taken i
        -- All of them in one look, taken after every lock above (see wake_queues.sql).
        cross join lateral sweep_queues_next_run_at(l.ctids, l.tenants, l.task_types, i.ids) n
        where l.ctids is not null and q.ctid = n.queue
    ),
    -- A rate-limited queue this claim emptied: its hint is corrected as above, under FOR
    -- UPDATE (refused while an enqueue is in flight); the claim already holds the row FOR NO
    -- KEY UPDATE, so this only waits for no one else.
    rated_dry as (
        select r.tenant, r.task_type
        from (select p.tenant, p.task_type from picked p
              where p.rated and not p.more
              order by p.tenant, p.task_type) p
        cross join lateral (
            select q2.tenant, q2.task_type from queues q2
            where q2.tenant = p.tenant and q2.task_type = p.task_type
            for update skip locked
        ) r
    ),
    -- The tokens this claim took, written back to each bucket it locked. By key, not ctid:
    -- the row version locked in sweep_queue_tokens may be newer than this statement's snapshot
    -- (a TID scan would not find it; the update follows it to the locked version).
    spent as (
        update queues q
        set tokens = b.available - coalesce(cardinality(p.ids), 0),
            refilled_at = b.at,
            next_run_at = case
                when exists (select 1 from rated_dry d
                             where d.tenant = q.tenant and d.task_type = q.task_type)
                then sweep_queue_next_run_at(q.tenant, q.task_type,
                                             (select i.ids from picked_ids i))
                else q.next_run_at end
        from picked p
        join tokens b on b.tenant = p.tenant and b.task_type = p.task_type
        where p.rated and b.available is not null
          and q.tenant = p.tenant and q.task_type = p.task_type
    ),
    -- Each task this claim takes with its queue's active module, looked up once per queue
    -- (two index probes a row cost a tenth of a crowded claim), resolved in the same statement:
    -- a newly activated version applies to every task claimed after the activation committed.
    taken_rows as (
        select u.ctid, m.*
        from (select p.tenant, p.task_type, p.ctids from picked p
              where p.ctids is not null
              union all
              select f.tenant, f.task_type, array_agg(f.ctid) from filled f
              group by f.tenant, f.task_type) q
        left join lateral (
            select mo.version, mo.sha256, mo.fuel, mo.timeout_ms, mo.memory_bytes,
                   mo.max_attempts, mo.backoff_base_ms, mo.backoff_cap_ms, mo.max_running
            from active_modules ac
            join modules mo
              on mo.tenant = ac.tenant and mo.task_type = ac.task_type
             and mo.version = ac.version
            where ac.tenant = q.tenant and ac.task_type = q.task_type
            -- (one row at most: the limit keeps it a lookup per queue, not a join of all)
            limit 1
        ) m on true
        cross join unnest(q.ctids) as u(ctid)
    ),
    -- By ctid: the very row versions locked above (a TID scan, no second index lookup).
    claimed as (
        update tasks t
        set state = 'running',
            attempts = t.attempts + 1,
            lease_owner = p_runner,
            lease_expires_at = now() + p_lease_ms * interval '1 millisecond',
            -- A rate-limited queue's tasks start at its bucket's clock (see flow_tokens.sql).
            started_at = coalesce(
                case when (select bool_or(p.rated) from picked p)
                     then (select b.at from tokens b
                           where b.tenant = t.tenant and b.task_type = t.task_type)
                end,
                now()),
            updated_at = now()
        from taken_rows r
        where t.ctid = r.ctid
        returning t.id, t.tenant, t.task_type, t.payload, t.attempts, t.max_attempts,
                  t.run_at, t.created_at, r.version, r.sha256, r.fuel, r.timeout_ms,
                  r.memory_bytes, r.max_attempts as module_max_attempts, r.backoff_base_ms,
                  r.backoff_cap_ms, r.max_running
    )
    select c.*
    from claimed c
    cross join (select set_config('synchronous_commit', 'off', true)) as async_commit;
end
$$;
