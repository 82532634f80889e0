-- Workflows (issue 31): tasks that wait for other tasks. Schema only; the statements that move
-- tasks through dependencies are in runner/sql/dependencies.sql.
--
-- A task enqueued `after` other tasks (its parents) is `blocked` while any parent has not
-- ended: it lives in `tasks` like the other live states, but no claim index covers it
-- (`tasks_queue` is partial on pending and retrying), so it costs the claim nothing.
-- `blocked_on` counts its parents that have not ended: each parent's end takes one off, in
-- the statement that ends the parent, and the statement that takes it to zero makes the task
-- pending (once: the row lock orders the parents' ends). Null for a task without parents.

alter table sweep.tasks drop constraint tasks_state_live;
alter table sweep.tasks add constraint tasks_state_live
    check (state in ('pending', 'running', 'retrying', 'blocked')) not valid;
alter table sweep.tasks validate constraint tasks_state_live;

alter table sweep.tasks add column blocked_on integer;
alter table sweep.tasks add constraint tasks_blocked_counts
    check ((state = 'blocked') = coalesce(blocked_on > 0, false)) not valid;
alter table sweep.tasks validate constraint tasks_blocked_counts;

-- One row per (parent, child) edge while the child waits. `ended` and `result` record how the
-- parent ended (its result, if it succeeded) until the child becomes due, when the parents'
-- rows are read into its input and deleted. `run_on_failure` and `result_budget` are the
-- child's (the same on each of its edges), so a parent's end decides its children without
-- reading them: run anyway or be cancelled, and how many bytes of results the child's input
-- may carry (what its payload limit left).
create table sweep.task_deps (
    parent         int8    not null,
    child          int8    not null,
    run_on_failure boolean not null default false,
    result_budget  int8    not null,
    ended          text,
    result         jsonb,
    primary key (parent, child),
    constraint task_deps_ended_known
        check (ended is null or ended in ('succeeded', 'cancelled', 'dead')),
    constraint task_deps_result_budget check (result_budget >= 0)
);

-- A child's edges, read when it becomes due or is cancelled.
create index task_deps_by_child on sweep.task_deps (child);

-- A workflow: named steps created together (POST /v1/workflows), each step one task whose
-- parents are the steps it names. The tasks carry the work and the state; these rows only
-- name them, so a workflow's state is read from its tasks.
create table sweep.workflows (
    id           bigserial   primary key,
    tenant       text        not null,
    created_at   timestamptz not null default now(),
    -- A cancel of the whole workflow was asked for (its steps were cancelled with it).
    cancelled_at timestamptz
);

create index workflows_by_tenant on sweep.workflows (tenant, id);

create table sweep.workflow_steps (
    workflow int8   not null references sweep.workflows (id) on delete cascade,
    name     text   not null,
    task     int8   not null,
    -- The steps it waits for, by name, as the request gave them.
    after    text[] not null default '{}',
    primary key (workflow, name),
    constraint workflow_steps_name_shape check (length(name) between 1 and 128)
);

create index workflow_steps_by_task on sweep.workflow_steps (task);
