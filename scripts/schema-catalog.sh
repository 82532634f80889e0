#!/usr/bin/env bash
# Prints the catalog of the `sweep` schema (runner/tests/schema/catalog.sql): one line per
# table, column, constraint, index, sequence, ..., in a fixed order, so two schemas compare
# with diff.
#
#   scripts/schema-catalog.sh URL      the schema of the database at URL
#   scripts/schema-catalog.sh --fresh  the schema `sweep migrate` of this checkout builds, in a
#                                      throwaway database on the server at DATABASE_URL
#
# runner/tests/schema/chain.txt, which the baseline migration is tested against, was written
# by `scripts/schema-catalog.sh --fresh > runner/tests/schema/chain.txt` at the last commit
# that had the migration chain 0001-0023 (`git log --diff-filter=A -- runner/tests/schema/chain.txt`).
set -euo pipefail
cd "$(dirname "$0")/.."

catalog() {
  psql -qAtX -v ON_ERROR_STOP=1 "$1" -f runner/tests/schema/catalog.sql
}

case "${1:-}" in
  --fresh)
    server="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
    url="${server%/*}/sweep_catalog_$$"
    trap 'psql -qAtX "${server%/*}/postgres" -c "drop database if exists sweep_catalog_$$" >/dev/null' EXIT
    cargo run -q -p sweep -- migrate --database-url "$url" >/dev/null
    catalog "$url"
    ;;
  '' | -h | --help)
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
  *)
    catalog "$1"
    ;;
esac
