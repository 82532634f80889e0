-- Kept counts of the history (`history_counts` and `history_deltas`,
-- migrations/0008_history_counts.sql): per tenant, task type and UTC day, how many retained
-- tasks ended succeeded, cancelled or dead. `GET /v1/stats` reads them instead of counting
-- `finished_tasks` and `dead_tasks`: a key's count is its total plus its deltas not yet folded.
--
-- Who keeps them:
--   - statement triggers on `finished_tasks` and `dead_tasks` (insert, delete, update: Sweep
--     never updates either, but a hand-made fix must not skew the counts; Postgres takes no
--     column list with transition tables; and truncate), over the statement's transition
--     tables: each appends its changes to `history_deltas`, one row per (tenant, type, day)
--     it touched, not one per task;
--   - retention (retention.sql), which bypasses those triggers by working on partitions
--     directly: it appends what a dropped partition held and what it deletes from the
--     default partition, negated. Moving a day's rows out of the default partition into a
--     new one changes no count (same rows, same day);
--   - sweep_history_fold(), called by every runner's maintenance every few seconds, which
--     moves the deltas into the totals;
--   - sweep_history_attach(), at the end of this file, which attaches the triggers once.
--
-- Why deltas: completions are the hot path, and many of them at once would each upsert the
-- same total rows (waiting on each other's row locks until commit) and pay an index probe and
-- an update per key; an append pays neither. The fold deletes the deltas it moves in the
-- statement that adds them to the totals, so each is counted once, whoever folds: a delta
-- committed during a fold is not seen by it and waits for the next; two folds at once take
-- turns (an advisory lock), and the totals are upserted in key order.

-- The statement that appends to the deltas what the rows of `p_rows` (a relation or
-- transition table of `p_table`, `finished_tasks` or `dead_tasks`) count for, times `p_sign`:
-- a finished task by its state, a dead one as dead, on its UTC day. For every writer but the
-- hot one (the insert trigger's static statements below, planned once per session).
create or replace function sweep.sweep_history_append(p_rows text, p_table text,
                                                      p_sign integer)
returns text
language sql immutable
as $$
    select format('insert into history_deltas (tenant, task_type, day, succeeded, cancelled,
                                               dead)
                   select tenant, task_type, %s from %s group by 1, 2, 3',
                  case p_table
                      when 'finished_tasks' then format(
                          '(finished_at at time zone ''UTC'')::date,
                           %1$s * count(*) filter (where state = ''succeeded''),
                           %1$s * count(*) filter (where state = ''cancelled''), 0', p_sign)
                      else format('(died_at at time zone ''UTC'')::date, 0, 0, %s * count(*)',
                                  p_sign)
                  end,
                  p_rows)
$$;

-- The trigger function of both tables (statement level; `new_rows` and `old_rows` are the
-- transition tables the triggers name). An insert, the one on every completion's way, is a
-- static statement per table (planned once per session); an update or a delete, which Sweep
-- itself never or rarely does, is a dynamic statement per side.
create or replace function sweep.sweep_history_changed()
returns trigger
language plpgsql volatile
set search_path = sweep
as $$
begin
    if tg_op = 'INSERT' and tg_table_name = 'finished_tasks' then
        insert into history_deltas (tenant, task_type, day, succeeded, cancelled, dead)
        select tenant, task_type, (finished_at at time zone 'UTC')::date,
               count(*) filter (where state = 'succeeded'),
               count(*) filter (where state = 'cancelled'), 0
        from new_rows
        group by 1, 2, 3;
    elsif tg_op = 'INSERT' then
        insert into history_deltas (tenant, task_type, day, succeeded, cancelled, dead)
        select tenant, task_type, (died_at at time zone 'UTC')::date, 0, 0, count(*)
        from new_rows
        group by 1, 2, 3;
    else
        if tg_op = 'UPDATE' then
            execute sweep_history_append('new_rows', tg_table_name, 1);
        end if;
        execute sweep_history_append('old_rows', tg_table_name, -1);
    end if;
    return null;
end
$$;

-- Moves the deltas committed so far into the totals (see the top of this file); deletes the
-- totals that came to zero. Returns how many deltas it moved; 0 when another fold is running.
create or replace function sweep.sweep_history_fold()
returns bigint
language plpgsql volatile
set search_path = sweep
as $$
declare
    moved bigint;
    zeroed history_counts[];
begin
    if not pg_try_advisory_xact_lock(hashtextextended('sweep.history_counts fold', 0)) then
        return 0;
    end if;
    with gone as (
        delete from history_deltas returning *
    ),
    summed as (
        select tenant, task_type, day, sum(succeeded)::int8 as succeeded,
               sum(cancelled)::int8 as cancelled, sum(dead)::int8 as dead
        from gone
        group by tenant, task_type, day
    ),
    added as (
        insert into history_counts as c (tenant, task_type, day, succeeded, cancelled, dead)
        select * from summed
        order by tenant, task_type, day
        on conflict (tenant, task_type, day) do update
        set succeeded = c.succeeded + excluded.succeeded,
            cancelled = c.cancelled + excluded.cancelled,
            dead = c.dead + excluded.dead
        returning c.*
    )
    select (select count(*) from gone),
           array(select a from added a where (succeeded, cancelled, dead) = (0, 0, 0))
    into moved, zeroed;
    delete from history_counts c
    using unnest(zeroed) z
    where (c.tenant, c.task_type, c.day) = (z.tenant, z.task_type, z.day)
      and (c.succeeded, c.cancelled, c.dead) = (0, 0, 0);
    return moved;
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
        update history_deltas set succeeded = 0, cancelled = 0
        where succeeded <> 0 or cancelled <> 0;
    else
        update history_counts set dead = 0 where dead <> 0;
        update history_deltas set dead = 0 where dead <> 0;
    end if;
    delete from history_counts where succeeded = 0 and cancelled = 0 and dead = 0;
    delete from history_deltas where succeeded = 0 and cancelled = 0 and dead = 0;
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
declare
    t text;
begin
    if exists (select from pg_trigger
               where tgrelid = 'finished_tasks'::regclass and tgname = 'history_counts_insert') then
        return false;
    end if;
    lock table finished_tasks, dead_tasks in share row exclusive mode;
    delete from history_counts;
    delete from history_deltas;
    -- The whole history as deltas, for the next fold.
    execute sweep_history_append('finished_tasks', 'finished_tasks', 1);
    execute sweep_history_append('dead_tasks', 'dead_tasks', 1);

    foreach t in array array['finished_tasks', 'dead_tasks'] loop
        execute format('create trigger history_counts_insert after insert on %I
                            referencing new table as new_rows
                            for each statement execute function sweep_history_changed()', t);
        execute format('create trigger history_counts_delete after delete on %I
                            referencing old table as old_rows
                            for each statement execute function sweep_history_changed()', t);
        execute format('create trigger history_counts_update after update on %I
                            referencing old table as old_rows new table as new_rows
                            for each statement execute function sweep_history_changed()', t);
        execute format('create trigger history_counts_truncate after truncate on %I
                            for each statement execute function sweep_history_truncated()', t);
    end loop;
    return true;
end
$$;
