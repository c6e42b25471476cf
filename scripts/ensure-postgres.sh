#!/bin/sh
# Makes sure the tests can get a PostgreSQL: a server named by
# RESERVEBENCH_DSN, or local binaries (initdb, pg_ctl, postgres, pgbench).
# On Debian/Ubuntu it installs the `postgresql` package when they are
# missing (as root, or through sudo). It never starts a server: the tests
# start their own throwaway clusters (pgtest).
set -eu

if [ -n "${RESERVEBENCH_DSN:-}" ]; then
  exit 0
fi

have_bins() {
  for d in "${RESERVEBENCH_PG_BINDIR:-}" "$(pg_config --bindir 2>/dev/null || true)" /usr/lib/postgresql/*/bin; do
    [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ] && return 0
  done
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1
}

if have_bins; then
  exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "ensure-postgres: PostgreSQL binaries are missing and installing them needs root: run 'apt-get install -y postgresql' as root, or set RESERVEBENCH_DSN" >&2
      exit 1
    fi
  fi
  echo "ensure-postgres: installing PostgreSQL (apt-get install -y postgresql)" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
  have_bins && exit 0
fi

echo "ensure-postgres: no PostgreSQL binaries found. Install them (Debian: apt-get install -y postgresql; macOS: brew install postgresql), point RESERVEBENCH_PG_BINDIR at them, or set RESERVEBENCH_DSN to a server." >&2
exit 1
