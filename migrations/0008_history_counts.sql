-- Kept counts of the history (issue 32): how many tasks of each tenant and task type ended
-- succeeded, cancelled or dead on each UTC day, so `GET /v1/stats` and the dashboard read a
-- few rows per task type instead of counting `finished_tasks` and `dead_tasks` on every call.
-- Schema only: runner/sql/history_counts.sql keeps them (statement triggers on both tables,
-- and retention's own deletes) and fills them the first time it is installed.
--
-- The totals only hold what is retained: a day's succeeded and cancelled counts go when
-- retention drops or deletes that day's rows; dead counts go with the dead tasks (requeued or
-- deleted). `day` is the UTC day of `finished_at` (of `died_at` for the dead).
create table sweep.history_counts (
    tenant    text not null,
    task_type text not null,
    day       date not null,
    succeeded int8 not null default 0,
    cancelled int8 not null default 0,
    dead      int8 not null default 0,
    primary key (tenant, task_type, day)
);

-- What changed since the last fold, appended by the statements that change the history and
-- moved into the totals every few seconds by a runner's maintenance: an append with no index
-- and no row shared between statements, where an upsert of the totals on every completion
-- cost a 1,000-tenant drain a tenth of its rate. The count of a key is its total plus its
-- deltas.
create table sweep.history_deltas (
    tenant    text not null,
    task_type text not null,
    day       date not null,
    succeeded int8 not null,
    cancelled int8 not null,
    dead      int8 not null
);
