-- The fair claim: up to $2 due tasks for runner $1, leased for $4 ms, shared out among the
-- tenants and task types that have due work. One statement, one round trip.
--
-- Parameters: $1 runner, $2 limit, $3 task types (empty: all), $4 lease in ms,
-- $5 starved only (the runner's spare instances: only queues with nothing running anywhere,
-- one task each), $6 where on the ring of queues this claim starts looking (random).
--
-- The policy, slot by slot: the next slot goes to the tenant holding the fewest running tasks
-- (across all runners) per unit of weight, ties broken at random; within that tenant, to the
-- task type holding the fewest; within the type, to the task of highest priority, then earliest
-- run_at, then lowest id. Tenant running caps and task type running limits bound each choice.
--
-- Cost: it reads the running tasks once (bounded by the runners' slots) and a window of at
-- most 2 * $2 + 16 due queues (from `queues`, never from the backlog), then one index probe per
-- chosen queue. Lookups go through jsonb objects rather than joins: this statement is planned
-- once per connection (generic plan) and joins between CTEs came out as nested loops.
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
         where q.next_run_at is not null and q.ring >= $6 and q.next_run_at <= now()
           and (cardinality($3::text[]) = 0 or q.task_type = any($3::text[]))
         order by q.ring
         limit 2 * $2 + 16)
        union all
        (select q.tenant, q.task_type, q.weight, q.max_running from queues q
         where q.next_run_at is not null and q.ring < $6 and q.next_run_at <= now()
           and (cardinality($3::text[]) = 0 or q.task_type = any($3::text[]))
         order by q.ring
         limit 2 * $2 + 16)
    ) s
    limit 2 * $2 + 16
),
-- How many of this claim's slots each queue could take (its running limit, via a try-lock
-- like the tenant cap's, see sweep_queue_free_slots).
queue_room as materialized (
    select s.tenant, s.task_type, s.weight, s.max_running is not null as capped,
           coalesce((r.by_queue ->> (s.tenant || '/' || s.task_type))::int8, 0) as running,
           coalesce((r.by_tenant ->> s.tenant)::int8, 0) as tenant_running,
           case when $5 then 1::int8
                when s.max_running is null then $2
                else least($2, sweep_queue_free_slots(s.tenant, s.task_type, s.max_running))
           end as room,
           random() as tie
    from sample s
    cross join running r
    where not $5 or not (r.by_queue ? (s.tenant || '/' || s.task_type))
),
caps as materialized (
    select name, sweep_tenant_free_slots(name, max_running) as free
    from tenants
    where max_running is not null and name in (select tenant from queue_room)
),
-- Per tenant: its weight, slots held, and room (its queues' room, bounded by its cap).
tenant_room as materialized (
    select q.tenant, max(q.weight)::float8 as weight, max(q.tenant_running)::float8 as running,
           least(sum(q.room)::int8, coalesce(min(c.free), $2)) as room,
           random() as tie
    from queue_room q
    left join caps c on c.name = q.tenant
    group by q.tenant
),
-- Slot by slot, as water-filling: the j-th slot a tenant would get in this claim has the key
-- (running + j - 1) / weight, and the $2 lowest keys win. Only the $2 tenants with the lowest
-- first key can win anything, and when there are $2 of them no winning key exceeds the
-- highest of their first keys, which bounds how many keys each one needs.
top_tenants as materialized (
    select * from tenant_room
    where room > 0
    order by running / weight, weight desc, tie
    limit $2
),
kth as (
    select case when count(*) >= $2 then max(running / weight) end as key from top_tenants
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
        from (select tenant from tenant_tickets order by key, weight desc, tie, j limit $2) best
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
-- One row more than wanted is looked at (and stays locked until commit, unused): without it,
-- the queue has run dry and its hint is corrected below.
picked as materialized (
    select a.tenant, a.task_type, a.want, p.more,
           p.ctids[1:a.want] as ctids, p.ids[1:a.want] as ids
    from (
        select tenant, task_type, count(*) as want
        from queue_tickets
        where rank <= slots
        group by tenant, task_type
    ) a
    cross join lateral (
        select array_agg(t.ctid order by t.priority desc, t.run_at, t.id) as ctids,
               array_agg(t.id order by t.priority desc, t.run_at, t.id) as ids,
               count(*) > a.want as more
        from (
            select t.ctid, t.id, t.priority, t.run_at from tasks t
            where t.tenant = a.tenant and t.task_type = a.task_type
              and t.state in ('pending', 'retrying') and t.run_at <= now()
            order by t.priority desc, t.run_at, t.id
            limit a.want + 1
            for update skip locked
        ) t
    ) p
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
        where not $5 and not q.capped
          and not exists (select 1 from caps c where c.name = q.tenant)
          and (select cardinality(ids) from picked_ids) < $2
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
        limit $2
        for update skip locked
    ) f
    limit greatest($2 - (select cardinality(ids) from picked_ids), 0)
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
        lease_owner = $1,
        lease_expires_at = now() + $4 * interval '1 millisecond',
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
-- Claims commit asynchronously, see claim.rs.
cross join (select set_config('synchronous_commit', 'off', true)) as async_commit
