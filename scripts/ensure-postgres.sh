#!/bin/sh
# Makes sure the tests can get a PostgreSQL: a server named by
# RESERVEBENCH_DSN, or local binaries (initdb, pg_ctl, postgres, pgbench)
# and libfaketime (the kit's checkClockAhead runs a server whose clock is
# ahead of the machine's). On Debian/Ubuntu it installs the `postgresql`
# and `libfaketime` packages when they are missing (as root, or through sudo). It never starts a server: the tests
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

have_faketime() {
  for f in "${RESERVEBENCH_FAKETIME:-}" /usr/lib/*-linux-gnu/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
    [ -n "$f" ] && [ -f "$f" ] && return 0
  done
  return 1
}

pkgs=""
have_bins || pkgs=" postgresql"
have_faketime || pkgs="$pkgs libfaketime"
if [ -z "$pkgs" ]; then
  exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "ensure-postgres: missing$pkgs, and installing needs root: run 'apt-get install -y$pkgs' as root, or set RESERVEBENCH_DSN" >&2
      exit 1
    fi
  fi
  echo "ensure-postgres: installing$pkgs (apt-get install -y$pkgs)" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  # shellcheck disable=SC2086 # a list of package names
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $pkgs >&2
  have_bins && have_faketime && exit 0
fi

have_bins || echo "ensure-postgres: no PostgreSQL binaries found. Install them (Debian: apt-get install -y postgresql; macOS: brew install postgresql), point RESERVEBENCH_PG_BINDIR at them, or set RESERVEBENCH_DSN to a server." >&2
have_faketime || echo "ensure-postgres: libfaketime not found (Debian: apt-get install -y libfaketime), or point RESERVEBENCH_FAKETIME at libfaketime.so.1." >&2
exit 1
