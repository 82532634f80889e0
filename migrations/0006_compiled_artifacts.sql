-- Compiled handlers shared by the fleet (issue 30): what a runner's compile child made of a
-- module (wasmtime's serialized form), so another runner, or this one after a restart, loads
-- it instead of compiling it again. Keyed by the module's sha256, the engine's compatibility
-- fingerprint (sandbox::Sandbox::artifact_engine) and the id of the deployment key
-- (SWEEP_SECRETS_KEY) that tagged it: an engine that compiles differently (another wasmtime,
-- other settings) has another fingerprint, runners of another key another id, and neither
-- ever matches these rows. `artifact_mac` is HMAC-SHA256, under a sub-key of the deployment
-- key that this database never holds, of the key fields, kind, module size and artifact; a
-- runner loads an artifact only when it verifies, so writing this table is not enough to
-- have runners execute code. `artifact_sha256` tells damage from forgery. Written by
-- queue::save_artifact (first writer wins), pruned by queue::prune_artifacts.
create table sweep.compiled_artifacts (
    module_sha256   text not null,
    engine          text not null,
    key_id          text not null,
    kind            text not null check (kind in ('module', 'component')),
    module_size     int8 not null check (module_size >= 0),
    artifact        bytea not null,
    artifact_sha256 text not null,
    artifact_mac    text not null,
    created_at      timestamptz not null default now(),
    primary key (module_sha256, engine, key_id)
);

-- Native code compresses poorly and is read whole: store it out of line uncompressed, so a
-- load is a copy, not a decompression of tens of MB.
alter table sweep.compiled_artifacts alter column artifact set storage external;
