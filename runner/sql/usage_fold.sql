-- Usage totals (`usage_days`, migrations/0002) and what was appended to them since the last
-- fold (`usage_deltas`, migrations/0010): the statements that record attempts (queue/usage.rs,
-- `usage_cte!`) append one row per tenant, task type, day and runner they counted; reads sum
-- both. Every runner's maintenance calls sweep_usage_fold() every few seconds (with the other
-- kept counts' folds, queue/stats.rs): in one statement it deletes the deltas it sees and adds
-- them to the totals, so each is counted once whoever folds; a delta committed meanwhile waits
-- for the next fold, and two folds take turns on an advisory lock. Totals are upserted in key
-- order and only ever grow (nothing prunes them).
create or replace function sweep.sweep_usage_fold()
returns bigint
language plpgsql volatile
set search_path = sweep
as $$
declare
    moved bigint;
begin
    if not pg_try_advisory_xact_lock(hashtextextended('sweep.usage_days fold', 0)) then
        return 0;
    end if;
    with gone as (
        delete from usage_deltas returning *
    ),
    added as (
        insert into usage_days as d (tenant, day, task_type, runner, attempts, succeeded,
                                     failed, wall_ms, fuel, peak_memory_bytes, http_requests,
                                     http_refused, bytes_sent, bytes_received)
        select tenant, day, task_type, runner, sum(attempts), sum(succeeded), sum(failed),
               sum(wall_ms), sum(fuel), max(peak_memory_bytes), sum(http_requests),
               sum(http_refused), sum(bytes_sent), sum(bytes_received)
        from gone
        group by tenant, day, task_type, runner
        order by tenant, day, task_type, runner
        on conflict (tenant, day, task_type, runner) do update
        set attempts = d.attempts + excluded.attempts,
            succeeded = d.succeeded + excluded.succeeded,
            failed = d.failed + excluded.failed,
            wall_ms = d.wall_ms + excluded.wall_ms,
            fuel = d.fuel + excluded.fuel,
            peak_memory_bytes = greatest(d.peak_memory_bytes, excluded.peak_memory_bytes),
            http_requests = d.http_requests + excluded.http_requests,
            http_refused = d.http_refused + excluded.http_refused,
            bytes_sent = d.bytes_sent + excluded.bytes_sent,
            bytes_received = d.bytes_received + excluded.bytes_received
    )
    select count(*) from gone into moved;
    return moved;
end
$$;
