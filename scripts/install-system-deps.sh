#!/usr/bin/env bash
# System packages the tests need, from Debian's archive. Idempotent: installs only what is missing.
# Recommends are left out: the tests need the programs, not their companions (prometheus
# recommends prometheus-node-exporter, another daemon).
set -euo pipefail
packages=()
for pkg in "$@"; do
  # "installed", not just known: a removed package keeps its config files and dpkg -s.
  [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" = "install ok installed" ] ||
    packages+=("$pkg")
done
((${#packages[@]})) || exit 0
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
  "${packages[@]}"

# Debian starts (and enables) a system Prometheus on :9090 when it installs the package. The
# tests start their own on a free port (e2e/prometheus.py); stop and disable the one we just
# installed so nothing listens there because of us. One installed earlier is left alone.
for pkg in "${packages[@]}"; do
  [ "$pkg" = prometheus ] || continue
  if [ -d /run/systemd/system ]; then
    $sudo_cmd systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    $sudo_cmd /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    $sudo_cmd update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
done
