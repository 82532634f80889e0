-- The operator's console (issue 29): dashboard sessions kept on the server, per-minute counters
-- for the dashboard's charts, and indexes that find tasks in the history and the dead-letter
-- table by task type prefix and by payload. Schema only.

-- A dashboard login. The browser's cookie holds a random session id; only its SHA-256 is kept
-- here, with the hash of the token that logged in: the session lasts while that token still
-- authenticates (a rotated or deleted token ends it at the next request) and until
-- `expires_at`; logging out deletes the row.
create table sweep.ui_sessions (
    id_sha256 text primary key,
    token_sha256 text not null,
    created_at timestamptz not null default now(),
    expires_at timestamptz not null,
    constraint ui_sessions_sha256_hex
        check (id_sha256 ~ '^[0-9a-f]{64}$' and token_sha256 ~ '^[0-9a-f]{64}$')
);
create index ui_sessions_expiry on sweep.ui_sessions (expires_at);

-- What the runners did, per minute, tenant and task type: written by each runner from what it
-- reported (summed, never read back by the hot path), read by the charts over bounded ranges
-- of minutes. `failures` counts failed attempts by kind (`{"timeout": 3, ...}`), cancelled
-- attempts included; `lag_ms` is a histogram of the time from a task being due to its start,
-- one count per bucket of `queue::MINUTE_LAG_BUCKETS_MS` (the last is everything above).
create table sweep.task_minutes (
    tenant text not null,
    task_type text not null,
    minute timestamptz not null,
    succeeded int8 not null default 0,
    failed int8 not null default 0,
    failures jsonb not null default '{}',
    started int8 not null default 0,
    lag_ms int8[] not null default '{}',
    primary key (tenant, task_type, minute),
    constraint task_minutes_whole_minute check (minute = date_trunc('minute', minute)),
    constraint task_minutes_failures_object check (jsonb_typeof(failures) = 'object')
);
create index task_minutes_by_minute on sweep.task_minutes (minute);

-- Finding tasks at scale. `text_pattern_ops` orders task types bytewise, so a prefix is one
-- index range (`task_type ~>=~ 'mail.' and task_type ~<~ 'mail/'`) in any collation, and
-- equality still uses it; `id` last keeps one type's rows newest first. `jsonb_path_ops` serves
-- payload containment (`payload @> '{"to": "a@example.com"}'`; a path = value search is
-- written as one). The live table gets neither: every claim and report writes a new version of
-- its rows, and each index would be written with it; the history and the dead letters are
-- written once per task.
create index finished_tasks_by_type on sweep.finished_tasks (tenant, task_type text_pattern_ops, id);
create index finished_tasks_payload on sweep.finished_tasks using gin (payload jsonb_path_ops);
create index dead_tasks_by_type_prefix on sweep.dead_tasks (tenant, task_type text_pattern_ops, id);
create index dead_tasks_payload on sweep.dead_tasks using gin (payload jsonb_path_ops);

-- `GET /v1/tasks/{id}?wait=30s`: a waiter marks the live task it waits for, and the statement
-- that ends a marked task (a report, a cancel, the reaper) sends `NOTIFY sweep_done, '<id>'`
-- in the same statement. Unmarked tasks (nearly all) end without a notification, so reports
-- do not take the commit-time lock that NOTIFY needs; the column is read from rows those
-- statements already hold, and it is in no index, so marking a row is a HOT update.
alter table sweep.tasks add column watched_at timestamptz;
