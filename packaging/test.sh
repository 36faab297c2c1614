#!/usr/bin/env bash
# Builds Anchorage and runs every test (CTest); installs the npm reference clients the tests use.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${ANCHORAGE_BUILD_DIR:-build}
jobs=${ANCHORAGE_JOBS:-$(nproc)}

echo "== npm reference clients (tests/tools)"
if [[ ! -d tests/tools/node_modules ]] || [[ tests/tools/package-lock.json -nt tests/tools/node_modules ]]; then
  (cd tests/tools && npm ci --no-audit --no-fund --loglevel=error)
fi
# Qwen Code pins itself (no dependencies of its own); its optional native add-ons are left out.
if [[ ! -d tests/tools/agent/node_modules ]] || [[ tests/tools/agent/package.json -nt tests/tools/agent/node_modules ]]; then
  (cd tests/tools/agent && npm install --omit=optional --no-package-lock --no-audit --no-fund --loglevel=error)
fi

echo "== configure"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ANCHORAGE_CMAKE_ARGS:-}

echo "== build"
time cmake --build "$build_dir" -j "$jobs"

echo "== test"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900
