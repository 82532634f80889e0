-- Dependencies: tasks that wait for other tasks (their parents) to end.
--
-- A child is enqueued `blocked` with `blocked_on` = its parents that have not ended, and one
-- `task_deps` row per parent (migrations/0004_workflows.sql). Each statement that ends a task
-- (a report, the reaper's, a cancel) calls sweep_parents_ended for the tasks it ended, which
-- takes the ended parents off their children's counts and records each end on the edges of
-- the children still waiting: O(1) per edge, however many parents a child has. The call that
-- takes a count to zero makes the child pending, with its parents' ids, states and results in
-- its payload (`$parents`). A parent that ended dead or cancelled instead cancels the child
-- (unless the child was enqueued to run anyway), and that cancel is an end like any other: its
-- own children are decided in the same call.
--
-- Races, and why these are VOLATILE PL/pgSQL: each query here takes a fresh snapshot.
--   - An enqueue locks its live parents FOR KEY SHARE until it commits; ending a parent
--     deletes its row, which waits for that lock. So the statement that ends the parent runs
--     sweep_parents_ended after the child's edges committed, and its fresh look finds them.
--   - A parent that ended before the enqueue could lock it is not found live; the enqueue's
--     next query (a fresh snapshot, after the lock wait) finds it finished or dead.
--   - Two parents of one child ending at once: each locks the child (in id order) before it
--     changes its count or writes its end on the edge; the second reads the count and the
--     edge the first left, with a fresh snapshot, so exactly one of them sees zero and
--     releases the child, with both ends in its input.
--   - A cancel of a waiting child deletes the child, then its edges; an end locks the child,
--     then writes the edges: the same order, so on these rows they wait, never deadlock.


-- Enqueues tasks that wait for parents: the tasks as column arrays (as the enqueue's INSERT
-- takes them), each task's policy (`p_run_on_failure`) and result budget, and the edges as
-- two parallel arrays (`p_edge_task`: the 1-based position of the child in the batch,
-- `p_edge_parent`: the parent's id). Answers one row per task, (position, id, null), in
-- input order; or, writing nothing, one row per bad edge, (edge position, null, problem):
-- `unknown` (no such task of the child's tenant) or `dead`/`cancelled` (the parent already
-- ended so and the child would not run anyway).
create or replace function sweep.sweep_enqueue_after(
    p_tenants text[], p_types text[], p_payloads text[], p_priorities int4[],
    p_run_ats timestamptz[], p_delays int8[], p_max_attempts int4[],
    p_run_on_failure boolean[], p_budgets int8[], p_edge_task int4[], p_edge_parent int8[],
    p_default_max_attempts int4)
returns table (pos int4, id int8, problem text)
language plpgsql volatile
set search_path = sweep
as $$
#variable_conflict use_column
declare
    parents  jsonb;
    bad      boolean;
begin
    -- Live parents, locked until this transaction commits (see the races above).
    with live as (
        select t.id, t.tenant from tasks t
        where t.id = any(p_edge_parent)
        order by t.id
        for key share
    )
    select coalesce(jsonb_object_agg(l.id::text, jsonb_build_object('tenant', l.tenant)), '{}')
    into parents from live l;

    -- Ended ones, with a fresh look (a parent may have ended while the lock above waited).
    select parents || coalesce(jsonb_object_agg(e.id::text, jsonb_build_object(
               'tenant', e.tenant, 'ended', e.state, 'result', e.result)), '{}')
    into parents
    from (
        select f.id, f.tenant, f.state, f.result from finished_tasks f
        where f.id = any(p_edge_parent) and not parents ? f.id::text
        union all
        select d.id, d.tenant, 'dead', null from dead_tasks d
        where d.id = any(p_edge_parent) and not parents ? d.id::text
    ) e;

    select exists (
        select 1 from unnest(p_edge_task, p_edge_parent) as e(task, parent)
        where parents -> e.parent::text is null
           or parents #>> array[e.parent::text, 'tenant'] <> p_tenants[e.task]
           or (parents #>> array[e.parent::text, 'ended'] in ('dead', 'cancelled')
               and not p_run_on_failure[e.task])
    ) into bad;
    if bad then
        return query
        select e.n::int4, null::int8,
               case when parents -> e.parent::text is null
                      or parents #>> array[e.parent::text, 'tenant'] <> p_tenants[e.task]
                    then 'unknown'
                    else parents #>> array[e.parent::text, 'ended']
               end
        from unnest(p_edge_task, p_edge_parent) with ordinality as e(task, parent, n)
        where parents -> e.parent::text is null
           or parents #>> array[e.parent::text, 'tenant'] <> p_tenants[e.task]
           or (parents #>> array[e.parent::text, 'ended'] in ('dead', 'cancelled')
               and not p_run_on_failure[e.task])
        order by e.n;
        return;
    end if;

    return query
    with input as materialized (
        select nextval(pg_get_serial_sequence('sweep.tasks', 'id')::regclass) as id, i.*
        from unnest(p_tenants, p_types, p_payloads, p_priorities, p_run_ats, p_delays,
                    p_max_attempts, p_run_on_failure, p_budgets)
             with ordinality
             as i(tenant, task_type, payload, priority, run_at, delay_ms, max_attempts,
                  run_on_failure, budget, ord)
    ),
    edges as (
        select e.task, e.parent, parents #>> array[e.parent::text, 'ended'] as ended,
               nullif(parents #> array[e.parent::text, 'result'], 'null') as result
        from (select distinct u.task, u.parent
              from unnest(p_edge_task, p_edge_parent) as u(task, parent)) e
    ),
    counts as (
        select input.ord, count(edges.parent) as parents,
               count(edges.parent) filter (where edges.ended is null) as waiting
        from input left join edges on edges.task = input.ord
        group by input.ord
    ),
    inserted as (
        insert into tasks (id, tenant, task_type, payload, priority, run_at, max_attempts,
                           state, blocked_on)
        select input.id, input.tenant, input.task_type,
               case when c.waiting > 0 or c.parents = 0 then input.payload::jsonb
                    else input.payload::jsonb || jsonb_build_object('$parents', (
                        -- every parent ended already: the input is whole now
                        select coalesce(jsonb_agg(
                                   jsonb_build_object('id', e.parent, 'state', e.ended)
                                   || case when e.result is null then '{}'::jsonb
                                           when e.cumulative <= input.budget
                                           then jsonb_build_object('result', e.result)
                                           else '{"result_omitted": true}'::jsonb
                                      end
                                   order by e.parent), '[]')
                        from (select edges.*,
                                     sum(coalesce(octet_length(edges.result::text), 0))
                                         over (order by edges.parent) as cumulative
                              from edges where edges.task = input.ord) e))
               end,
               input.priority,
               coalesce(input.run_at, now() + input.delay_ms * interval '1 millisecond'),
               coalesce(input.max_attempts,
                        (select m.max_attempts from active_modules a
                         join modules m using (tenant, task_type, version)
                         where a.tenant = input.tenant and a.task_type = input.task_type),
                        p_default_max_attempts),
               case when c.waiting > 0 then 'blocked' else 'pending' end,
               nullif(c.waiting, 0)
        from input join counts c on c.ord = input.ord
        order by input.ord
        returning tasks.id, tasks.tenant, tasks.task_type, tasks.run_at, tasks.state
    ),
    linked as (
        insert into task_deps (parent, child, run_on_failure, result_budget, ended, result)
        select edges.parent, input.id, input.run_on_failure, greatest(input.budget, 0),
               edges.ended, edges.result
        from edges
        join input on input.ord = edges.task
        join counts c on c.ord = input.ord
        where c.waiting > 0
        order by edges.parent, input.id
        returning 1
    ),
    due as (
        select i.tenant, i.task_type, i.run_at from inserted i where i.state = 'pending'
    ),
    woken as (
        select sweep_wake_queues(w.tenants, w.task_types, w.run_ats),
               pg_notify('sweep_tasks', '')
        from (
            select array_agg(g.tenant) as tenants, array_agg(g.task_type) as task_types,
                   array_agg(g.run_at) as run_ats
            from (select d.tenant, d.task_type, min(d.run_at) as run_at from due d
                  group by d.tenant, d.task_type) g
        ) w
        where w.tenants is not null
    )
    select input.ord::int4, input.id, null::text
    from input
    cross join (select count(*) from inserted) i
    cross join (select count(*) from linked) l
    cross join (select count(*) from woken) w
    order by input.ord;
end
$$;

-- Records that tasks ended (`p_ids`, each `p_states`: succeeded, cancelled or dead) on their
-- children's edges, and decides the children: each takes its ended parents off its count and
-- becomes pending at zero, with `$parents` in its payload; one whose parent ended dead or
-- cancelled is cancelled instead (unless it runs anyway), and those cancels are ended tasks in
-- turn, decided by the next round of the loop. `p_reports` holds the succeeded ones' results
-- as the reports sent them (`{"<id>": {"result": ...}}`), or is null. Returns how many
-- children it changed. Costs one index probe per id when the ids have no children.
create or replace function sweep.sweep_parents_ended(p_ids int8[], p_states text[],
                                                     p_reports jsonb)
returns int4
language plpgsql volatile
set search_path = sweep
as $$
declare
    ids       int8[] := p_ids;
    states    text[] := p_states;
    results   jsonb[];
    children  int8[];
    counts    int4[];
    culprits  int8[];
    verdicts  text[];
    cancelled int8[];
    released  int8[];
    changed   int4 := 0;
begin
    if not exists (select 1 from task_deps where parent = any(ids)) then
        return 0;
    end if;
    while cardinality(ids) > 0 loop
        -- What each end hands on: a succeeded one's result as its report sent it, else null.
        select coalesce(array_agg(case when e.state = 'succeeded'
                                       then nullif(p_reports #> array[e.id::text, 'result'],
                                                   'null')
                                  end order by e.n), '{}')
        into results
        from unnest(ids, states) with ordinality as e(id, state, n);

        -- The edges these ends decide (a parent ends once, so each edge is decided once).
        -- They are written below only for the children that go on waiting: a child decided
        -- now has its edges deleted, and reads these ends from `ids` and `results`.
        with ended as (
            select d.parent, d.child, e.state as ended, d.run_on_failure
            from task_deps d
            join unnest(ids, states) as e(id, state) on d.parent = e.id
            where d.ended is null
        )
        select coalesce(array_agg(g.child order by g.child), '{}'),
               coalesce(array_agg(g.n order by g.child), '{}'),
               coalesce(array_agg(g.culprit order by g.child), '{}'),
               coalesce(array_agg(g.verdict order by g.child), '{}')
        into children, counts, culprits, verdicts
        from (
            select x.child, count(*)::int4 as n,
                   min(x.parent) filter (where x.ended <> 'succeeded' and not x.run_on_failure)
                       as culprit,
                   (array_agg(x.ended order by x.parent)
                       filter (where x.ended <> 'succeeded' and not x.run_on_failure))[1]
                       as verdict
            from ended x
            group by x.child
        ) g;
        exit when cardinality(children) = 0;

        -- The children's rows, locked in id order as every batch statement locks.
        perform 1 from tasks t where t.id = any(children) and t.state = 'blocked'
        order by t.id for no key update;

        -- A parent ended dead or cancelled: the child is cancelled, naming it.
        with doomed as (
            select c.id, c.culprit, c.verdict
            from unnest(children, culprits, verdicts) as c(id, culprit, verdict)
            where c.culprit is not null
        ),
        gone as (
            delete from tasks t using doomed
            where t.id = doomed.id and t.state = 'blocked'
            returning t.*, doomed.culprit, doomed.verdict,
                      case when t.watched_at is not null
                           then pg_notify('sweep_done', t.id::text) end as woke
        ),
        moved as (
            insert into finished_tasks (id, tenant, task_type, payload, state, priority,
                                        attempts, max_attempts, run_at, dedup_key, last_error,
                                        errors, module_sha256, created_at, started_at)
            select g.id, g.tenant, g.task_type, g.payload, 'cancelled', g.priority, g.attempts,
                   g.max_attempts, g.run_at, g.dedup_key,
                   format('parent %s ended %s', g.culprit, g.verdict),
                   g.errors || jsonb_build_array(jsonb_build_object(
                       'at', now(), 'attempt', g.attempts, 'kind', 'cancelled',
                       'message', format('parent %s ended %s', g.culprit, g.verdict),
                       'parent', g.culprit)),
                   g.module_sha256, g.created_at, g.started_at
            from gone g
            returning finished_tasks.id
        )
        select coalesce(array_agg(m.id order by m.id), '{}') into cancelled from moved m;

        -- The others take their ended parents off their counts; zero makes them due, with
        -- their parents' ends in their input: this round's from `results`, the earlier ones
        -- from the edges (written by the parents' ends committed before this transaction locked
        -- the child).
        --
        -- That input is `$parents`: one entry per parent
        -- in id order, {"id", "state", "result"}, where `result` is the parent's result if it
        -- succeeded. Results are included in that order while their running total stays
        -- within the edge's `result_budget` bytes (what the child's payload limit left); from
        -- the first that does not fit on, an entry has `"result_omitted": true` instead.
        -- Built for all of them in one pass over their edges, not by a function call per
        -- child (~35 us each, most of a 3-level workflow's fan-out). The rows are locked
        -- above, so the counts read here are the ones the update below changes.
        with c as (
            select c.id, c.n from unnest(children, counts) as c(id, n)
            where c.id <> all(cancelled)
        ),
        zero as (
            select t.id from tasks t join c on c.id = t.id
            where t.state = 'blocked' and t.blocked_on <= c.n
        ),
        inputs as (
            select x.child, jsonb_agg(
                       case when x.result is null
                                then jsonb_build_object('id', x.parent, 'state', x.ended)
                            when x.used <= x.result_budget
                                then jsonb_build_object('id', x.parent, 'state', x.ended,
                                                        'result', x.result)
                            else jsonb_build_object('id', x.parent, 'state', x.ended,
                                                    'result_omitted', true)
                       end order by x.parent) as entries
            from (
                select y.*, sum(coalesce(octet_length(y.result::text), 0))
                                over (partition by y.child order by y.parent) as used
                from (
                    select d.child, d.parent, d.result_budget,
                           coalesce(d.ended, e.state) as ended,
                           case when d.ended is null then e.result else d.result end as result
                    from task_deps d
                    left join unnest(ids, states, results) as e(id, state, result)
                           on e.id = d.parent
                    where d.child = any(array(select z.id from zero z))
                ) y
            ) x
            group by x.child
        ),
        counted as (
            update tasks t
            set blocked_on = nullif(t.blocked_on - c.n, 0),
                state = case when t.blocked_on > c.n then 'blocked' else 'pending' end,
                run_at = case when t.blocked_on > c.n then t.run_at
                              else greatest(t.run_at, now()) end,
                payload = case when t.blocked_on > c.n then t.payload
                               else t.payload || jsonb_build_object('$parents',
                                   coalesce(i.entries, '[]'))
                          end,
                updated_at = now()
            from c left join inputs i on i.child = c.id
            where t.id = c.id and t.state = 'blocked'
            returning t.id, t.tenant, t.task_type, t.run_at, t.state
        ),
        due as (select * from counted where state = 'pending'),
        woken as (
            select sweep_wake_queues(w.tenants, w.task_types, w.run_ats),
                   pg_notify('sweep_tasks', '')
            from (
                select array_agg(g.tenant) as tenants, array_agg(g.task_type) as task_types,
                       array_agg(g.run_at) as run_ats
                from (select d.tenant, d.task_type, min(d.run_at) as run_at from due d
                      group by d.tenant, d.task_type) g
            ) w
            where w.tenants is not null
        )
        select coalesce(array_agg(d.id), '{}') into released
        from due d cross join (select count(*) from woken) w;

        changed := changed + cardinality(cancelled)
                   + (select count(*)::int4 from unnest(children, culprits) as c(id, culprit)
                      where c.culprit is null);
        -- The edges of the children decided go; those still waiting keep these ends on
        -- their edges, for the input they get once due. Deleted first, so the update finds
        -- only the edges it is for (in a fan-out, where most children have one parent,
        -- nearly every child is decided, and nothing is written only to be deleted).
        delete from task_deps where child = any(released || cancelled);
        if cardinality(released) + cardinality(cancelled) < cardinality(children) then
            update task_deps d
            set ended = e.state, result = e.result
            from unnest(ids, states, results) as e(id, state, result)
            where d.parent = e.id and d.ended is null;
        end if;

        -- The cancelled children ended too: their own children are next.
        ids := cancelled;
        states := array_fill('cancelled'::text, array[cardinality(cancelled)]);
        p_reports := null;
    end loop;
    return changed;
end
$$;
