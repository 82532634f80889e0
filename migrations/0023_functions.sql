-- Sweep's SQL functions leave the migrations: their source is runner/sql/, one file per
-- concern, and `sweep migrate` installs them after the migrations (create or replace, in one
-- transaction; runner/src/queue/functions.rs). This table records what it installed: the
-- hash of the files and the version of the sweep that installed them, which a store compares
-- with its own at open. One row.
create table sweep._functions (
    singleton     boolean     primary key default true check (singleton),
    sha256        text        not null,
    sweep_version text        not null,
    installed_at  timestamptz not null default now()
);
