#!/bin/sh
# Makes sure the tests can get a Redis: a server named by RESERVEBENCH_REDIS,
# or a local redis-server binary (RESERVEBENCH_REDIS_SERVER, PATH, /usr/bin,
# /usr/local/bin). On Debian/Ubuntu it installs the `redis-server` package
# when the binary is missing (as root, or through sudo), without letting the
# package start its system service: the tests start their own throwaway
# instances (redistest), and a system redis-server left running would only
# be in the way.
set -eu

if [ -n "${RESERVEBENCH_REDIS:-}" ]; then
  exit 0
fi

have_bin() {
  for b in "${RESERVEBENCH_REDIS_SERVER:-}" "$(command -v redis-server 2>/dev/null || true)" /usr/bin/redis-server /usr/local/bin/redis-server; do
    [ -n "$b" ] && [ -x "$b" ] && return 0
  done
  return 1
}

if have_bin; then
  exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "ensure-redis: redis-server is missing and installing it needs root: run 'apt-get install -y redis-server' as root, or set RESERVEBENCH_REDIS" >&2
      exit 1
    fi
  fi
  echo "ensure-redis: installing Redis (apt-get install -y redis-server)" >&2
  # policy-rc.d answering 101 keeps the package from starting its service;
  # one that is already there is left as it is.
  policy=/usr/sbin/policy-rc.d
  made_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    made_policy=1
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >&2 || {
    [ -n "$made_policy" ] && $SUDO rm -f "$policy"
    exit 1
  }
  [ -n "$made_policy" ] && $SUDO rm -f "$policy"
  # Should a service have started anyway (an init without policy-rc.d),
  # stop it and keep it from starting at boot.
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/redis-server ]; then
    $SUDO /etc/init.d/redis-server stop >/dev/null 2>&1 || true
  fi
  have_bin && exit 0
fi

echo "ensure-redis: no redis-server binary found. Install it (Debian: apt-get install -y redis-server; macOS: brew install redis), point RESERVEBENCH_REDIS_SERVER at it, or set RESERVEBENCH_REDIS to a server (redis://host:port or unix:///path)." >&2
exit 1
