-- An enqueue lowers its queue's hint with one row lock instead of two when it can.
-- (Names its schema: it also runs on databases migrated by hand, see 0010.)
--
-- Why: every statement that makes tasks wait calls `sweep_wake_queues` (0009, 0015). It
-- holds each queue row FOR KEY SHARE until it commits, and then lowers the hint under FOR NO
-- KEY UPDATE SKIP LOCKED. On an idle queue the hint is null after every claim (the claim
-- found the queue short and cleared it), so each single-task enqueue takes both locks on the
-- same row: the KEY SHARE lock writes the row's lock bits (a heap change and a WAL record)
-- and the update writes a new row version. pgbench put the whole call at ~0.45 ms of a
-- ~0.8 ms enqueue (statement and commit) on a 2-core machine, against 0.35-0.45 ms for the
-- same statement without it.
--
-- The lowering alone is enough when it succeeds: the update holds the row FOR NO KEY UPDATE
-- until this transaction commits, which conflicts with the FOR UPDATE a claim or the hint
-- repair needs to raise or clear the hint, exactly as KEY SHARE does. So the call first tries
-- to lower every queue's hint, skipping rows it cannot lock at once; when that lowered all of
-- them, it is done. Otherwise the rest get the KEY SHARE lock and the fresh look at their
-- hint they always got (a hint already early enough, the common case on a busy queue, needs
-- nothing more), and a hint found late, because another transaction held its row, is
-- lowered by a second pass. A queue with no row yet goes to 0015's function, renamed
-- `sweep_wake_queues_locking`, which creates it as it always did.

alter function sweep.sweep_wake_queues(text[], text[], timestamptz[])
    rename to sweep_wake_queues_locking;

create function sweep.sweep_wake_queues(p_tenant text[], p_task_type text[],
                                        p_run_at timestamptz[])
returns void language plpgsql volatile
set search_path = sweep
as $$
declare
    -- Callers pass each queue once (one entry per distinct queue of their rows).
    queues  integer := cardinality(p_tenant);
    lowered bigint;
    held    bigint;
    late    bigint;
begin
    -- Two passes at most: a hint the first pass could not lower because another transaction
    -- held its row is lowered by the second, after the KEY SHARE lock waited for that one.
    for pass in 1..2 loop
        with l as (
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
            where q.ctid = l.ctid
            returning 1
        )
        select count(*) into lowered from l;
        exit when pass = 2 or lowered = queues;

        -- The rest: KEY SHARE (rows lowered above are held already), with a fresh look at
        -- each hint once its row is locked.
        select count(*), count(*) filter (where k.next_run_at is null or k.next_run_at > k.run_at)
        into held, late
        from (
            select q.next_run_at, w.run_at
            from queues q
            join unnest(p_tenant, p_task_type, p_run_at) as w(tenant, task_type, run_at)
              on q.tenant = w.tenant and q.task_type = w.task_type
            order by q.tenant, q.task_type
            for key share of q
        ) k;
        if held < queues then
            -- A queue without a row yet: 0015's function creates it, copying its tenant's
            -- state, and does the rest as it always did.
            perform sweep_wake_queues_locking(p_tenant, p_task_type, p_run_at);
            return;
        end if;
        exit when late = 0;
    end loop;
end
$$;
