-- (Names its schema: it also runs on databases migrated by hand, see 0010.)
--
-- Per-tenant size limits (null: the deployment's default):
--   max_payload_bytes  largest task payload the tenant may enqueue, as compact JSON; checked
--                      by the admin API before anything is written (default: its
--                      --max-payload-bytes)
--   max_result_bytes   largest result (the handler's stdout) a task of the tenant may write;
--                      the runner stops a handler that writes more (output_too_large) and
--                      caps it by its own --output-bytes ceiling (default: its --output-bytes)

alter table sweep.tenants add column max_payload_bytes bigint;
alter table sweep.tenants add column max_result_bytes bigint;
alter table sweep.tenants add constraint tenants_size_limits_positive check (
    coalesce(max_payload_bytes, 1) > 0 and coalesce(max_result_bytes, 1) > 0);
