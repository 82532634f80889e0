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
-- them, it is done. Otherwise (a queue row that does not exist yet, a hint that is already
-- early enough, a row another transaction holds) it runs 0015's function, unchanged: the
-- rows it lowered here it holds already, and the rest get the KEY SHARE lock and the second
-- look they always got. The cost of the fallback is one more probe per queue.

alter function sweep.sweep_wake_queues(text[], text[], timestamptz[])
    rename to sweep_wake_queues_locking;

create function sweep.sweep_wake_queues(p_tenant text[], p_task_type text[],
                                        p_run_at timestamptz[])
returns void language plpgsql volatile
set search_path = sweep
as $$
declare
    lowered bigint;
begin
    -- Callers pass each queue once (one entry per distinct queue of their rows), so every
    -- queue was lowered when as many rows were.
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
    if lowered < cardinality(p_tenant) then
        perform sweep_wake_queues_locking(p_tenant, p_task_type, p_run_at);
    end if;
end
$$;
