#!/usr/bin/env bash
# Installs the system packages the local cluster needs: Prometheus (Debian's package, started by
# the launcher, never as a service), iproute2 (`ip netns`, veth, bridge for pod networking) and a
# Go toolchain check for building the control plane. Idempotent: does nothing when all are present.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || need+=(prometheus)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v openssl >/dev/null 2>&1 || need+=(ca-certificates)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "Missing system packages: ${need[*]}; run as root: apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "Installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends: we want the binary, not the exporters it recommends
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  # Debian starts the packaged service; the launcher runs its own Prometheus per cluster
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  echo "Go (>= 1.25) is needed to build the control plane (e2e/k8sbin/build.sh); none found" >&2
  exit 1
fi
