-- A claim that starts where the claimer's last claim from the same queue ended.
-- (Names its schema: it also runs on databases migrated by hand, see 0010.)
--
-- Why: a claim scans `tasks_queue` from the head of its queue. Every task claimed since the
-- last vacuum left an entry there (its row version before the claim), and every claim walks
-- past all of them before it reaches a due task: `perf` put that walk at 20-30% of
-- Postgres's samples in pgbench runs of the claim between vacuums. A claimer that
-- remembers the key (priority, run_at, id) of the last task it claimed can start its scan
-- there instead, and walks only what other claimers took since its own last claim.
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
-- first-come-first-served up to that bound, as it already was up to SKIP LOCKED.
--
-- Only the single-queue path (one due queue, no limits: a runner draining one task type)
-- uses a cursor; a claim without one, or with another queue's, starts at the queue's head,
-- and returns the priorities the claimer's next cursor is made of. Every other claim is
-- 0020's `sweep_claim`, called as it is; its rows come back with a null priority, which tells
-- the claimer to drop its cursor. 0020's function stays for runners of the previous version
-- during a rolling upgrade.

create function sweep.sweep_claim_from(p_runner uuid, p_limit bigint, p_task_types text[],
                                       p_lease_ms bigint, p_ring integer,
                                       p_cursor_tenant text, p_cursor_type text,
                                       p_cursor_priority integer,
                                       p_cursor_run_at timestamptz, p_cursor_id bigint)
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
    if due_queues = 1 and not limited then
        if only_tenant = p_cursor_tenant and only_type = p_cursor_type then
            at_priority := p_cursor_priority;
            at_run_at := p_cursor_run_at;
            at_id := p_cursor_id;
        end if;
        return query
        -- The ranges in order, each a subquery of its own (FOR UPDATE is not allowed on a
        -- UNION). The append runs them one after another and stops as soon as the claim is
        -- full: a range after the one that filled it is never scanned, and rows are locked
        -- only as they are taken.
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
        -- Fewer due tasks than asked for: correct the hint, as 0020's single-queue path does.
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
                      t.run_at, t.created_at, t.priority
        ),
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
        return;
    end if;

    -- Not the one-queue case: 0020's claim, as it is.
    return query
    select c.*, null::integer
    from sweep_claim(p_runner, p_limit, p_task_types, p_lease_ms, false, p_ring) c;
end
$$;
