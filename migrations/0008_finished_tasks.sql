-- Finished tasks leave the hot table. `tasks` holds only live work (pending, retrying,
-- running); a task that succeeds or is cancelled moves to `finished_tasks` in the statement
-- that finishes it (DELETE ... RETURNING feeding an INSERT), as dying tasks already move to
-- `dead_tasks`.
--
-- Why: with history kept in `tasks`, every claim paid for it. The table's statistics described
-- the history rather than the backlog (bad plans), vacuum had a million rows to scan before it
-- could clean the claim index's head, and every completion inserted into a `tasks_finished`
-- index. `finished_tasks` is append-only: nothing on the claim path reads it, and retention
-- deletes from its old end.
--
-- State moves after this migration:
--   running            -> succeeded   complete_batch: row moves to finished_tasks
--   pending | retrying -> cancelled   cancel: row moves to finished_tasks
-- (the rest as in 0001_queue.sql).

create table finished_tasks (
    id            bigint      primary key,
    tenant        text        not null,
    task_type     text        not null,
    payload       jsonb       not null,
    state         text        not null,
    priority      integer     not null,
    attempts      integer     not null,
    max_attempts  integer     not null,
    run_at        timestamptz not null,
    dedup_key     text,
    last_error    text,
    errors        jsonb       not null,
    result        jsonb,
    module_sha256 text,
    logs          text,
    created_at    timestamptz not null,
    started_at    timestamptz,
    finished_at   timestamptz not null default now(),

    constraint finished_tasks_state_known check (state in ('succeeded', 'cancelled'))
);

-- Retention deletes from the old end; "completed in the last minute" reads the new end.
create index finished_tasks_finished_at on finished_tasks (finished_at);

insert into finished_tasks (id, tenant, task_type, payload, state, priority, attempts,
                            max_attempts, run_at, dedup_key, last_error, errors, result,
                            module_sha256, logs, created_at, started_at, finished_at)
select id, tenant, task_type, payload, state, priority, attempts, max_attempts, run_at,
       dedup_key, last_error, errors, result, module_sha256, logs, created_at, started_at,
       finished_at
from tasks
where state in ('succeeded', 'cancelled');

delete from tasks where state in ('succeeded', 'cancelled');

drop index tasks_finished;
alter table tasks drop constraint tasks_finished_iff_terminal;
alter table tasks drop constraint tasks_state_known;
alter table tasks add constraint tasks_state_live check (state in ('pending', 'running', 'retrying'));
alter table tasks drop column result;
alter table tasks drop column logs;
alter table tasks drop column finished_at;

-- A queue table empties and refills all day: never let VACUUM truncate its trailing empty
-- pages, which takes an ACCESS EXCLUSIVE lock that stalls every claim and enqueue behind it
-- (and the space is reused by the next backlog anyway).
alter table tasks set (vacuum_truncate = false);
