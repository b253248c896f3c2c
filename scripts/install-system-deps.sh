#!/usr/bin/env bash
# System packages the tests need, from Debian's archive. Idempotent: installs only what is missing.
set -euo pipefail
packages=()
for pkg in "$@"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || packages+=("$pkg")
done
if ((${#packages[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${packages[@]}"
fi
