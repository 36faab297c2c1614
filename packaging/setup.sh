#!/usr/bin/env bash
# Installs every build and test dependency of Anchorage on Debian 12 (run as root); idempotent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  qt6-base-dev qt6-base-dev-tools qt6-charts-dev libqt6sql6-sqlite libgl-dev
  nlohmann-json3-dev libzstd-dev libsqlite3-dev libcpp-httplib-dev
  libpng-dev libjpeg62-turbo-dev libwebp-dev libssl-dev ca-certificates
  xvfb xauth python3-jinja2 unicode-data
)
# Node.js with npm runs the reference clients; Debian's npm conflicts with a preinstalled NodeSource node.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup.sh: missing packages: ${missing[*]}; run as root to install them" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
else
  echo "setup.sh: all ${#packages[@]} packages present"
fi
