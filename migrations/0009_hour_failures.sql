-- Failed attempts in the last hour, kept per tenant and task type (issue 32), so `GET
-- /v1/stats` reads a few rows per task type instead of summing an hour of per-minute counters
-- (60 rows per type). Schema only: runner/sql/hour_failures.sql keeps them (statement
-- triggers on `task_minutes` and a fold every few seconds) and fills them the first time it
-- is installed.
--
-- A total is the sum of `task_minutes.failed` over the key's minutes after `since`; the fold
-- adds what its deltas bring and takes away the minutes that leave the hour, and moves
-- `since` with them. A key with no row has nothing folded after the last fold's `since`.
create table sweep.hour_failures (
    tenant    text not null,
    task_type text not null,
    since     timestamptz not null,
    failed    int8 not null,
    primary key (tenant, task_type)
);

-- What the runners' flushes added to `task_minutes.failed` since the last fold, appended by
-- the triggers and moved into the totals by the fold: no index, no row shared between
-- flushes.
create table sweep.hour_failure_deltas (
    tenant    text not null,
    task_type text not null,
    minute    timestamptz not null,
    failed    int8 not null
);
