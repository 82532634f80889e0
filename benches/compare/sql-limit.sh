#!/usr/bin/env bash
# The raw Postgres ceiling for claiming and completing tasks on this machine: pgbench runs the
# bare SQL of a SKIP LOCKED batch claim followed by a batch completion (two transactions per
# batch, like a runner that claims a batch and then reports it) against a scratch database
# with a plain task table and claim index. No runner, no driver, no sandbox: the ceiling a
# runner is measured against.
#
#   benches/compare/sql-limit.sh [BATCH ...]     (default: 1 10 50)
#
# env: DATABASE_URL (its server is used; default the local one), CLIENTS (4),
#      SECONDS_PER_RUN (8), ROWS (600000)
# prints one line per batch size:  batch=50 clients=4 jobs_per_s=29600
set -euo pipefail
batches=("$@"); [ $# -eq 0 ] && batches=(1 10 50)
clients=${CLIENTS:-4}; secs=${SECONDS_PER_RUN:-8}; rows=${ROWS:-600000}
server="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
server="${server%/*}"
db=sweep_sql_limit
url="$server/$db"
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
command -v pgbench >/dev/null || { echo "sql-limit: pgbench not found (Debian: postgresql or postgresql-contrib)" >&2; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
psql -qX "$server/postgres" -c "drop database if exists $db" -c "create database $db" >/dev/null
psql -qX "$url" >/dev/null <<'SQL'
create table tasks (
  id bigserial primary key,
  task_type text not null,
  payload jsonb not null,
  state text not null default 'pending',
  priority int not null default 0,
  run_at timestamptz not null default now(),
  attempts int not null default 0,
  max_attempts int not null default 5,
  lease_owner text, lease_expires_at timestamptz,
  last_error text,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);
create index tasks_claim on tasks (priority desc, run_at, id) where state in ('pending', 'retrying');
SQL
cat > "$work/claim.sql" <<'SQL'
with picked as (
  select id from tasks
  where state in ('pending', 'retrying') and run_at <= now()
  order by priority desc, run_at, id
  limit :batch
  for update skip locked),
claimed as (
  update tasks t set state = 'running', attempts = attempts + 1, lease_owner = 'bench',
    lease_expires_at = now() + interval '30 seconds', updated_at = now()
  from picked where t.id = picked.id
  returning t.id)
select quote_literal(coalesce(array_agg(id), '{}')::text) as ids from claimed \gset
update tasks set state = 'succeeded', lease_owner = null, lease_expires_at = null, updated_at = now()
where id = any(:ids::bigint[]) and state = 'running';
SQL
for b in "${batches[@]}"; do
  psql -qX "$url" -c "truncate tasks" >/dev/null
  psql -qX "$url" -c "insert into tasks (task_type, payload) select 'noop', jsonb_build_object('i', g) from generate_series(1, $rows) g" >/dev/null
  psql -qX "$url" -c "vacuum analyze tasks" >/dev/null
  tps=$(pgbench -n -f "$work/claim.sql" -D batch="$b" -c "$clients" -j "$clients" -T "$secs" "$url" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  done_rows=$(psql -qXAt "$url" -c "select count(*) from tasks where state = 'succeeded'")
  [ "$done_rows" -lt "$rows" ] || echo "sql-limit: warning: batch=$b drained the table; raise ROWS" >&2
  awk -v b="$b" -v c="$clients" -v t="$tps" 'BEGIN { printf "batch=%d clients=%d jobs_per_s=%.0f\n", b, c, t * b }'
done
psql -qX "$server/postgres" -c "drop database if exists $db" >/dev/null
