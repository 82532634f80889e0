-- What the statements that record attempts add to the usage totals, appended (issue 32): the
-- upsert of `usage_days` in every completion cost a statement of 250 tasks from 250 tenants
-- an index probe and a row update per tenant (about 3 ms of the statement). Schema only:
-- runner/sql/usage_fold.sql moves the deltas into `usage_days` every few seconds, and reads
-- add both. Same columns as `usage_days`; no key, no index.
create table sweep.usage_deltas (
    tenant            text    not null,
    day               date    not null,
    task_type         text    not null,
    runner            uuid    not null,
    attempts          int8    not null,
    succeeded         int8    not null,
    failed            int8    not null,
    wall_ms           int8    not null,
    fuel              numeric not null,
    peak_memory_bytes int8    not null,
    http_requests     int8    not null,
    http_refused      int8    not null,
    bytes_sent        int8    not null,
    bytes_received    int8    not null
);
