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

# Debian starts (and enables) a system service when it installs prometheus (:9090) or
# redis-server (:6379). The tests start their own on free ports (e2e/prometheus.py,
# e2e/redis.py); stop and disable the ones we just installed so nothing listens because of us.
# One installed earlier is left alone.
for pkg in "${packages[@]}"; do
  case "$pkg" in
    prometheus|redis-server) service="$pkg" ;;
    *) continue ;;
  esac
  if [ -d /run/systemd/system ]; then
    $sudo_cmd systemctl disable --now "$service.service" >/dev/null 2>&1 || true
  elif [ -x "/etc/init.d/$service" ]; then
    $sudo_cmd "/etc/init.d/$service" stop >/dev/null 2>&1 || true
    $sudo_cmd update-rc.d "$service" disable >/dev/null 2>&1 || true
  fi
done

# Debian's podman enables its API socket and restart units on install; the tests call podman
# directly with a storage of their own (e2e/images.py): nothing of it needs to run as a service.
for pkg in "${packages[@]}"; do
  [ "$pkg" = podman ] || continue
  if [ -d /run/systemd/system ]; then
    $sudo_cmd systemctl disable --now podman.socket podman.service podman-restart.service \
      >/dev/null 2>&1 || true
  fi
done
