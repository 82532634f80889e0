-- Failed attempts in the last hour, kept per tenant and task type (`hour_failures` and
-- `hour_failure_deltas`, migrations/0009_hour_failures.sql), for `GET /v1/stats`: summing
-- `task_minutes` over the hour read 60 rows per task type on every call.
--
-- A key's total is the sum of its `task_minutes.failed` after `since`, as of the last fold.
-- Who keeps it:
--   - statement triggers on `task_minutes` (insert, update, delete, truncate), which append
--     what each statement changed to the deltas, one row per key and minute: the runners'
--     flushes (an upsert fires both the insert and the update trigger), maintenance's prune,
--     and any hand-made fix;
--   - sweep_hour_failures_fold(), called by every runner's maintenance every few seconds:
--     in one statement (one snapshot), it deletes the deltas, adds those of minutes after
--     each key's `since` to its total, takes away the minutes that left the hour (up to the
--     new `since`, the start of the minute 61 minutes ago) and moves `since` there. Deltas of
--     minutes before a key's `since` are dropped: the total no longer covers them. A delta
--     committed during a fold waits for the next one; two folds take turns (an advisory
--     lock). A total that comes to zero is deleted: a key with no row has nothing folded
--     after the last `since`, so its deltas alone are its count;
--   - sweep_hour_failures_attach(), which attaches the triggers once and counts what is there.
--
-- The read (queue/stats.rs) adds a key's total, its deltas after `since` (the last fold's, or
-- 61 minutes ago for a key with no row), and takes away what of `task_minutes` after `since`
-- is outside the window (the oldest minute in part): a few rows per key while folds keep up.

-- The trigger function (statement level; `new_rows` and `old_rows` are the transition tables
-- the triggers name).
create or replace function sweep.sweep_hour_failures_changed()
returns trigger
language plpgsql volatile
set search_path = sweep
as $$
begin
    if tg_op = 'INSERT' then
        insert into hour_failure_deltas (tenant, task_type, minute, failed)
        select tenant, task_type, minute, failed from new_rows where failed <> 0;
    elsif tg_op = 'UPDATE' then
        -- Paired through the key, which an update may change too.
        insert into hour_failure_deltas (tenant, task_type, minute, failed)
        select tenant, task_type, minute, sum(failed)
        from (select tenant, task_type, minute, failed from new_rows
              union all
              select tenant, task_type, minute, -failed from old_rows) c
        group by 1, 2, 3
        having sum(failed) <> 0;
    elsif tg_op = 'DELETE' then
        insert into hour_failure_deltas (tenant, task_type, minute, failed)
        select tenant, task_type, minute, -failed from old_rows where failed <> 0;
    else
        delete from hour_failures;
        delete from hour_failure_deltas;
    end if;
    return null;
end
$$;

-- Folds the deltas committed so far and the minutes that left the hour into the totals (see
-- the top of this file). Returns how many deltas it moved; 0 when another fold is running.
create or replace function sweep.sweep_hour_failures_fold()
returns bigint
language plpgsql volatile
set search_path = sweep
as $$
declare
    cutoff timestamptz := date_trunc('minute', now()) - interval '61 minutes';
    moved bigint;
begin
    if not pg_try_advisory_xact_lock(hashtextextended('sweep.hour_failures fold', 0)) then
        return 0;
    end if;
    with gone as (
        delete from hour_failure_deltas returning *
    ),
    added as (
        select g.tenant, g.task_type, g.failed
        from gone g left join hour_failures k using (tenant, task_type)
        where g.minute > coalesce(k.since, cutoff)
    ),
    -- Every minute the totals cover up to the cutoff is in the snapshot with its deltas
    -- (a flush writes both in one statement), so what leaves is `task_minutes` itself.
    left_hour as (
        select k.tenant, k.task_type, -m.failed as failed
        from hour_failures k
        join task_minutes m on (m.tenant, m.task_type) = (k.tenant, k.task_type)
                           and m.minute > k.since and m.minute <= cutoff
        where k.since < cutoff
    ),
    moved_since as (
        select tenant, task_type, 0::int8 as failed from hour_failures where since < cutoff
    ),
    folded as (
        insert into hour_failures as h (tenant, task_type, since, failed)
        select tenant, task_type, cutoff, sum(failed)
        from (select * from added
              union all select * from left_hour
              union all select * from moved_since) c
        group by 1, 2
        order by 1, 2
        on conflict (tenant, task_type) do update
        set failed = h.failed + excluded.failed, since = excluded.since
    )
    select count(*) from gone into moved;
    -- Only folds write the totals, and this one holds the lock.
    delete from hour_failures where failed = 0;
    return moved;
end
$$;

-- Attaches the triggers, once: `sweep migrate` calls it after installing the functions
-- (queue/functions.rs), in the same transaction. The first call appends what `task_minutes`
-- holds as deltas for the next fold, under a lock that holds flushes back until that
-- transaction commits (so no count is missed or counted twice), and attaches the triggers;
-- it answers whether it did.
create or replace function sweep.sweep_hour_failures_attach()
returns boolean
language plpgsql volatile
set search_path = sweep
as $$
begin
    if exists (select from pg_trigger
               where tgrelid = 'task_minutes'::regclass and tgname = 'hour_failures_insert') then
        return false;
    end if;
    lock table task_minutes in share row exclusive mode;
    delete from hour_failures;
    delete from hour_failure_deltas;
    insert into hour_failure_deltas (tenant, task_type, minute, failed)
    select tenant, task_type, minute, failed from task_minutes
    where failed <> 0 and minute > now() - interval '61 minutes';

    create trigger hour_failures_insert after insert on task_minutes
        referencing new table as new_rows
        for each statement execute function sweep_hour_failures_changed();
    create trigger hour_failures_update after update on task_minutes
        referencing old table as old_rows new table as new_rows
        for each statement execute function sweep_hour_failures_changed();
    create trigger hour_failures_delete after delete on task_minutes
        referencing old table as old_rows
        for each statement execute function sweep_hour_failures_changed();
    create trigger hour_failures_truncate after truncate on task_minutes
        for each statement execute function sweep_hour_failures_changed();
    return true;
end
$$;
