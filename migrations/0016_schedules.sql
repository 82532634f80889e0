-- Cron schedules: each row enqueues one task per tick of its cron expression, evaluated in its
-- IANA time zone. `next_run_at` is the next tick to enqueue (UTC); a runner's scheduler locks
-- due rows (FOR UPDATE SKIP LOCKED), enqueues the tick's task with the dedup key
-- 'schedule:<id>:<tick>' and advances `next_run_at` in the same transaction, so each tick
-- yields one task however many runners run.
create table sweep.schedules (
    id             bigserial primary key,
    tenant         text not null,
    name           text not null,
    cron           text not null,
    timezone       text not null default 'UTC',
    task_type      text not null,
    payload        jsonb not null default '{}',
    priority       int4 not null default 0,
    max_attempts   int4,
    -- skip: no task for a tick while the schedule's previous task is still live; allow.
    overlap        text not null default 'skip' check (overlap in ('skip', 'allow')),
    -- After downtime: latest: the latest missed tick runs once; skip: late ticks do not run.
    catch_up       text not null default 'latest' check (catch_up in ('latest', 'skip')),
    paused_at      timestamptz,
    next_run_at    timestamptz not null,
    -- The tick of the last task enqueued, and that task.
    last_run_at    timestamptz,
    last_task_id   int8,
    -- Ticks that enqueued nothing because the previous task was live (overlap = skip).
    skipped_ticks  int8 not null default 0,
    created_at     timestamptz not null default now(),
    unique (tenant, name)
);

-- The scheduler's scan: due, unpaused schedules in tick order.
create index schedules_due on sweep.schedules (next_run_at) where paused_at is null;
