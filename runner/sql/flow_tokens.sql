-- Rate limits: a queue may carry a token bucket, at most `rate_per_sec` starts per second on
-- average and `burst` at once (queue/flow.rs sets them). The bucket (`tokens`, as of
-- `refilled_at`; null: full) lives on the queue row and is only read and written by claims
-- holding that row FOR NO KEY UPDATE (sweep_queue_tokens, below), so claims of all runners
-- take from one bucket in turn and together never start more than `burst + rate_per_sec * T`
-- tasks in any T seconds. The claim (claim.sql) takes min(free slots, whole tokens) from such
-- a queue and writes back what it took; its tasks' started_at is the bucket's clock, read
-- under the lock, so the bound holds of the tasks' own timestamps.


-- The bucket of rate-limited queue (`p_tenant`, `p_task_type`) now: `available` tokens (whole
-- ones may be taken) as of `at`. Locks the queue row FOR NO KEY UPDATE until the claim commits
-- (compatible with the KEY SHARE of enqueues, so an enqueue never waits on it); when another
-- claim holds it, `available` is 0 and this claim skips the queue, as a try-lock would.
-- `available` null: the queue is no longer limited.
--
-- `at` is the later of the bucket's last time and clock_timestamp(), so the bucket's clock
-- never runs back whichever claim's transaction started first. VOLATILE, like the free-slot
-- functions: the row is read in a fresh snapshot, after any claim that held it committed.
create or replace function sweep.sweep_queue_tokens(p_tenant text, p_task_type text,
                                                    out available float8, out at timestamptz)
language plpgsql volatile
set search_path = sweep
as $$
declare
    b record;
begin
    select q.rate_per_sec, q.burst, q.tokens, q.refilled_at into b
    from queues q
    where q.tenant = p_tenant and q.task_type = p_task_type
    for no key update skip locked;
    if not found then
        available := 0;
        return;
    end if;
    if b.rate_per_sec is null then
        return;
    end if;
    at := greatest(coalesce(b.refilled_at, '-infinity'), clock_timestamp());
    available := coalesce(
        least(b.burst::float8,
              b.tokens + b.rate_per_sec * extract(epoch from at - b.refilled_at)::float8),
        b.burst::float8);
end
$$;
