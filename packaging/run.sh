#!/usr/bin/env bash
# Builds Anchorage and starts it: the console where there is a display, else anchorage-server.
# With no --model DIR it generates the tiny model into the data folder and serves that.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${ANCHORAGE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)"

if [[ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" && -x "$build_dir/app/anchorage" ]]; then
  exec "$build_dir/app/anchorage" "$@"
fi
exec "$build_dir/app/anchorage-server" "$@"
