#!/usr/bin/env bash
# Prepares the checkout for tools/device-check.sh: the GPU machine has no nlohmann/json package, so
# its headers travel in .device/include (git-ignored; the device tool's carry names .device).
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/include/nlohmann
[ -f "$src/json.hpp" ] || { echo "nlohmann/json headers not found at $src (apt-get install nlohmann-json3-dev)" >&2; exit 1; }
rm -rf .device/include
mkdir -p .device/include
cp -r "$src" .device/include/
echo "ready: .device/include/nlohmann ($(du -sh .device/include | cut -f1)); run with carry [\".device\"]"
