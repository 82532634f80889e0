-- History: `finished_tasks` is partitioned by range of `finished_at`, one partition per UTC
-- day (`finished_tasks_YYYYMMDD`, [day, day + 1)), plus the default partition
-- (`finished_tasks_default`): the safety net that catches a row no day partition covers
-- (maintenance did not run for days), so an insert never fails; the next maintenance moves
-- those rows into the day partitions it creates for them.
--
-- Who does what (all in sweep_finished_retention, which every runner's retention calls through
-- queue::retain_finished; `sweep migrate` makes the first days' partitions):
--   creates   the day partitions from today to a few days ahead, so the partition a
--             completion needs exists days before it is needed, and those of the days of
--             unexpired rows waiting in the default partition;
--   drops     every partition whose upper bound is older than the retention TTL, whole;
--   deletes   rows older than the TTL only in the default partition (and a partition without
--             a lower bound, which a database partitioned by hand may hold), in bounded
--             batches. A day partition is never deleted from row by row: it is dropped once
--             wholly older than the TTL, so a finished task is kept at least the TTL and at
--             most the TTL plus one day.
--   subtracts what it drops or deletes from the kept counts (history_counts.sql: negated
--             deltas): it works on partitions directly, where the parent's statement
--             triggers do not fire. A dropped partition is counted before it goes (one scan
--             of a day, once).
--
-- Locks: a partition is created as a plain table and then ATTACHed, which takes SHARE UPDATE
-- EXCLUSIVE on the parent (completions and reads go on) and ACCESS EXCLUSIVE on the default
-- partition for a moment. Dropping a partition needs ACCESS EXCLUSIVE on the parent (DETACH
-- CONCURRENTLY cannot run in a transaction nor next to a default partition), so every DDL
-- statement runs under a short lock_timeout: a drop that would queue behind a long reader
-- (and stall completions behind itself) gives up and is tried again at the next run.
-- Runners maintain one at a time (a transaction-scoped advisory try-lock); the DDL also
-- tolerates a concurrent creator or dropper that does not take the lock.
--
-- A lookup by id cannot be pruned (the partition key is the finish time): it probes each
-- partition's primary key, (id, finished_at), about a dozen index probes at the default
-- retention. Ids stay unique by construction (a task row moves here once, from `tasks`).


-- Every partition: its bounds, read back from the catalog (null lower: from minus infinity).
create or replace function sweep.sweep_finished_partitions()
returns table (part regclass, is_default boolean, lower timestamptz, upper timestamptz)
language sql stable
set search_path = sweep
-- pg_get_expr writes the bounds in this session's time zone and date style, and they are
-- read back in the same.
set timezone = 'UTC'
set datestyle = 'ISO, YMD'
as $$
    select c.oid::regclass, b.bound = 'DEFAULT',
           (regexp_match(b.bound, 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
           (regexp_match(b.bound, 'TO \(''([^'']*)''\)'))[1]::timestamptz
    from pg_inherits i
    join pg_class c on c.oid = i.inhrelid
    cross join lateral (select pg_get_expr(c.relpartbound, c.oid) as bound) b
    where i.inhparent = 'sweep.finished_tasks'::regclass
$$;

-- Creates the day partition of every UTC day from p_from's to p_to's that no partition covers
-- yet, moving that day's rows out of the default partition into it. Returns how many it
-- created. A day that another session is creating at the same moment, or whose locks are not
-- granted within the lock_timeout, is left for the next call.
create or replace function sweep.sweep_finished_add_partitions(p_from timestamptz,
                                                               p_to timestamptz)
returns integer
language plpgsql volatile
set search_path = sweep
set timezone = 'UTC'
set datestyle = 'ISO, YMD'
set lock_timeout = '200ms'
as $$
declare
    d timestamptz;
    part_name text;
    fallback regclass;
    made integer := 0;
begin
    perform pg_advisory_xact_lock(hashtextextended('sweep.finished_tasks partitions', 0));
    for d in
        select generate_series(date_trunc('day', p_from, 'UTC'), date_trunc('day', p_to, 'UTC'),
                               interval '1 day')
    loop
        continue when exists (
            select 1 from sweep_finished_partitions() p
            where not p.is_default
              and (p.lower is null or p.lower < d + interval '1 day') and p.upper > d);
        part_name := 'finished_tasks_' || to_char(d, 'YYYYMMDD');
        select nullif(partdefid, 0)::regclass into fallback
        from pg_partitioned_table where partrelid = 'finished_tasks'::regclass;
        begin
            execute format('create table %I (like finished_tasks including defaults
                                              including constraints including storage)', part_name);
            if fallback is not null then
                execute format('with moved as (delete from %s where finished_at >= $1
                                                 and finished_at < $2 returning *)
                                insert into %I select * from moved', fallback, part_name)
                using d, d + interval '1 day';
            end if;
            execute format('alter table finished_tasks attach partition %I
                                for values from (%L) to (%L)', part_name, d, d + interval '1 day');
            made := made + 1;
        exception
            -- lock_timeout; a table of that name (made by someone not taking the lock); an
            -- overlapping partition; a row of that day that reached the default partition
            -- after the move above.
            when lock_not_available or duplicate_table or invalid_object_definition
                 or check_violation then
                null;
        end;
    end loop;
    return made;
end
$$;

-- Retention (see the top of this file): creates the day partitions up to p_ahead_days ahead,
-- drops the partitions wholly older than p_keep_ms, and deletes at most p_batch rows older
-- than that from the default partition. Returns what it did; when another runner is at it,
-- does nothing.
create or replace function sweep.sweep_finished_retention(p_keep_ms bigint, p_ahead_days integer,
                                                          p_batch integer)
returns table (created integer, dropped integer, deleted bigint)
language plpgsql volatile
set search_path = sweep
set timezone = 'UTC'
set datestyle = 'ISO, YMD'
set lock_timeout = '200ms'
as $$
declare
    -- (A TTL past a century is a century: the interval must not overflow.)
    cutoff timestamptz := now() - least(p_keep_ms, 3155760000000) * interval '1 millisecond';
    fallback regclass;
    d timestamptz;
    p record;
    n bigint;
begin
    created := 0;
    dropped := 0;
    deleted := 0;
    if not pg_try_advisory_xact_lock(hashtextextended('sweep.finished_tasks partitions', 0)) then
        return next;
        return;
    end if;

    created := sweep_finished_add_partitions(now(), now() + p_ahead_days * interval '1 day');
    select nullif(partdefid, 0)::regclass into fallback
    from pg_partitioned_table where partrelid = 'finished_tasks'::regclass;
    if fallback is null then
        begin
            create table if not exists finished_tasks_default partition of finished_tasks default;
        exception when lock_not_available then
            null;
        end;
    else
        -- Only the days that have rows waiting: an empty partition would cost every lookup
        -- by id one more probe until it expired.
        for d in execute format('select distinct date_trunc(''day'', finished_at, ''UTC'')
                                 from %s where finished_at >= $1', fallback)
                 using cutoff
        loop
            created := created + sweep_finished_add_partitions(d, d);
        end loop;
    end if;

    for p in
        select * from sweep_finished_partitions() f
        where not f.is_default and f.upper <= cutoff
        order by f.upper
    loop
        begin
            -- What the partition held leaves the kept counts with it (history_counts.sql);
            -- a drop that gives up takes that back with it.
            execute sweep_history_append(p.part::text, 'finished_tasks', -1);
            execute format('drop table %s', p.part);
            dropped := dropped + 1;
        exception when lock_not_available then
            exit;
        end;
    end loop;

    for p in
        select * from sweep_finished_partitions() f
        where f.is_default or f.lower is null
    loop
        execute format('with gone as (
                            delete from %s where ctid = any(array(
                                select ctid from %s where finished_at < $1
                                order by finished_at limit $2 for update skip locked))
                            returning tenant, task_type, finished_at, state),
                        uncounted as (%s)
                        select count(*) from gone',
                       p.part, p.part, sweep_history_append('gone', 'finished_tasks', -1))
        using cutoff, p_batch - deleted
        into n;
        deleted := deleted + n;
        exit when deleted >= p_batch;
    end loop;
    return next;
end
$$;
