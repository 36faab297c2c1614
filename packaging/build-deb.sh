#!/usr/bin/env bash
# Builds build-deb/anchorage_<version>_amd64.deb: the three binaries, the desktop entry and icons,
# the systemd user unit and the docs. Compiled for any x86-64 (no -march=native), in a tree of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${ANCHORAGE_DEB_BUILD_DIR:-build-deb}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DANCHORAGE_NATIVE=OFF ${ANCHORAGE_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "${ANCHORAGE_JOBS:-$(nproc)}" --target anchorage anchorage-server anchorage-tool anchorage_icon_pngs
(cd "$build_dir" && cpack -G DEB)
ls -1 "$build_dir"/anchorage_*_amd64.deb
