-- Kept counts of the history (`history_counts`, migrations/0008_history_counts.sql): per
-- tenant, task type and UTC day, how many retained tasks ended succeeded, cancelled or dead.
-- `GET /v1/stats` reads them instead of counting `finished_tasks` and `dead_tasks`.
--
-- Who keeps them:
--   - statement triggers on `finished_tasks` and `dead_tasks` (insert, delete, update: Sweep
--     never updates either, but a hand-made fix must not skew the counts; Postgres takes no
--     column list with transition tables; and truncate), over the statement's transition
--     tables: one grouped upsert per statement, so a completion of 250 tasks adds to one row
--     per (tenant, type, day) it touched, not 250 times to one;
--   - `sweep_history_attach()`, at the end of this file, which attaches the triggers once;
--   - retention (retention.sql), which bypasses those triggers by working on partitions
--     directly: it subtracts what a dropped partition held and what it deletes from the
--     default partition. Moving a day's rows out of the default partition into a new one
--     changes no count (same rows, same day).
--
-- Concurrency: the upsert adds deltas (never sets), sorted by key, so statements adding to the
-- same rows wait for each other in one order and never deadlock; a row is held from the end of
-- the statement to its commit. Two runners completing tasks of one task type on the same day
-- therefore take turns on that row's lock for the length of a commit.

-- Adds signed deltas to the counts, one sorted upsert. A delta for a row that does not exist
-- yet creates it (a negative one too: a count that went wrong shows instead of vanishing).
create or replace function sweep.sweep_history_add(p_delta sweep.history_counts[])
returns void
language sql volatile
set search_path = sweep
as $$
    insert into history_counts as c (tenant, task_type, day, succeeded, cancelled, dead)
    select tenant, task_type, day, sum(succeeded)::int8, sum(cancelled)::int8, sum(dead)::int8
    from unnest(p_delta)
    group by tenant, task_type, day
    order by tenant, task_type, day
    on conflict (tenant, task_type, day) do update
    set succeeded = c.succeeded + excluded.succeeded,
        cancelled = c.cancelled + excluded.cancelled,
        dead = c.dead + excluded.dead
$$;

-- `finished_tasks`' trigger function (statement level; `new_rows` and `old_rows` are the
-- transition tables its triggers name). An insert, the one on every completion's way, adds
-- its counts directly: building the deltas as an array costs a 250-task completion about a
-- fifth more.
create or replace function sweep.sweep_history_finished()
returns trigger
language plpgsql volatile
set search_path = sweep
as $$
declare
    delta history_counts[] := '{}';
begin
    if tg_op = 'INSERT' then
        insert into history_counts as c (tenant, task_type, day, succeeded, cancelled)
        select tenant, task_type, (finished_at at time zone 'UTC')::date,
               count(*) filter (where state = 'succeeded'),
               count(*) filter (where state = 'cancelled')
        from new_rows
        group by 1, 2, 3
        order by 1, 2, 3
        on conflict (tenant, task_type, day) do update
        set succeeded = c.succeeded + excluded.succeeded,
            cancelled = c.cancelled + excluded.cancelled;
        return null;
    end if;
    if tg_op = 'UPDATE' then
        delta := array(
            select row(g.*)::history_counts from (
                select tenant, task_type, (finished_at at time zone 'UTC')::date,
                       count(*) filter (where state = 'succeeded'),
                       count(*) filter (where state = 'cancelled'), 0::int8
                from new_rows group by 1, 2, 3) g);
    end if;
    delta := delta || array(
        select row(g.*)::history_counts from (
            select tenant, task_type, (finished_at at time zone 'UTC')::date,
                   -count(*) filter (where state = 'succeeded'),
                   -count(*) filter (where state = 'cancelled'), 0::int8
            from old_rows group by 1, 2, 3) g);
    perform sweep_history_add(delta);
    return null;
end
$$;

-- `dead_tasks`' trigger function, the same over `died_at`.
create or replace function sweep.sweep_history_dead()
returns trigger
language plpgsql volatile
set search_path = sweep
as $$
declare
    delta history_counts[] := '{}';
begin
    if tg_op = 'INSERT' then
        insert into history_counts as c (tenant, task_type, day, dead)
        select tenant, task_type, (died_at at time zone 'UTC')::date, count(*)
        from new_rows
        group by 1, 2, 3
        order by 1, 2, 3
        on conflict (tenant, task_type, day) do update set dead = c.dead + excluded.dead;
        return null;
    end if;
    if tg_op = 'UPDATE' then
        delta := array(
            select row(g.*)::history_counts from (
                select tenant, task_type, (died_at at time zone 'UTC')::date, 0::int8, 0::int8,
                       count(*)
                from new_rows group by 1, 2, 3) g);
    end if;
    delta := delta || array(
        select row(g.*)::history_counts from (
            select tenant, task_type, (died_at at time zone 'UTC')::date, 0::int8, 0::int8,
                   -count(*)
            from old_rows group by 1, 2, 3) g);
    perform sweep_history_add(delta);
    return null;
end
$$;

-- A TRUNCATE of either table (on the table itself; one of a partition is not seen) empties
-- its counts.
create or replace function sweep.sweep_history_truncated()
returns trigger
language plpgsql volatile
set search_path = sweep
as $$
begin
    if tg_table_name = 'finished_tasks' then
        update history_counts set succeeded = 0, cancelled = 0
        where succeeded <> 0 or cancelled <> 0;
    else
        update history_counts set dead = 0 where dead <> 0;
    end if;
    delete from history_counts where succeeded = 0 and cancelled = 0 and dead = 0;
    return null;
end
$$;

-- Attaches the triggers, once: `sweep migrate` calls it after installing the functions
-- (queue/functions.rs), in the same transaction. The first call counts the history there is
-- (under a lock that holds completions and dead-letter moves back until that transaction
-- commits, so no row is counted twice or missed) and attaches the triggers; it answers
-- whether it did. Later calls find them and take no lock on the tables; a change to the set
-- of triggers needs a guard of its own here.
create or replace function sweep.sweep_history_attach()
returns boolean
language plpgsql volatile
set search_path = sweep
set timezone = 'UTC'
as $$
begin
    if exists (select from pg_trigger
               where tgrelid = 'finished_tasks'::regclass and tgname = 'history_counts_insert') then
        return false;
    end if;
    lock table finished_tasks, dead_tasks in share row exclusive mode;
    delete from history_counts;
    insert into history_counts (tenant, task_type, day, succeeded, cancelled, dead)
    select tenant, task_type, day, sum(succeeded), sum(cancelled), sum(dead)
    from (
        select tenant, task_type, (finished_at at time zone 'UTC')::date as day,
               count(*) filter (where state = 'succeeded') as succeeded,
               count(*) filter (where state = 'cancelled') as cancelled, 0 as dead
        from finished_tasks group by 1, 2, 3
        union all
        select tenant, task_type, (died_at at time zone 'UTC')::date, 0, 0, count(*)
        from dead_tasks group by 1, 2, 3
    ) counted
    group by tenant, task_type, day;

    create trigger history_counts_insert after insert on finished_tasks
        referencing new table as new_rows
        for each statement execute function sweep_history_finished();
    create trigger history_counts_delete after delete on finished_tasks
        referencing old table as old_rows
        for each statement execute function sweep_history_finished();
    create trigger history_counts_update after update on finished_tasks
        referencing old table as old_rows new table as new_rows
        for each statement execute function sweep_history_finished();
    create trigger history_counts_truncate after truncate on finished_tasks
        for each statement execute function sweep_history_truncated();
    create trigger history_counts_insert after insert on dead_tasks
        referencing new table as new_rows
        for each statement execute function sweep_history_dead();
    create trigger history_counts_delete after delete on dead_tasks
        referencing old table as old_rows
        for each statement execute function sweep_history_dead();
    create trigger history_counts_update after update on dead_tasks
        referencing old table as old_rows new table as new_rows
        for each statement execute function sweep_history_dead();
    create trigger history_counts_truncate after truncate on dead_tasks
        for each statement execute function sweep_history_truncated();
    return true;
end
$$;
