#!/usr/bin/env bash
# Installs the system packages the tiers need: Prometheus (Debian's package: `promtool` for the
# unit tier's rule tests, `prometheus` started by the cluster launcher, never as a service),
# iproute2 (`ip netns`, veth, bridge for pod networking), iptables (the local cluster enforces
# NetworkPolicy with iptables-restore), the CA bundle, and a C compiler with the C library's
# headers (the engine builds its CPU decode kernel on first use). With `--fresh-check`
# also Docker's engine and debootstrap, which the fresh-machine check (`make test-fresh`) needs;
# with `--real-node` the real node's containerd, runc and CNI plugins, Docker's engine (it turns
# root file systems into image tarballs) and a static libc (the pause binary).
# Idempotent: does nothing when all are present. Python, Go and root are checked by
# e2e/check-prereqs.sh (`make prereqs`), not installed.
#
# Usage: e2e/install-system-deps.sh [--fresh-check] [--real-node] [--list]
#   --list  print the missing packages (one line, space-separated) and install nothing
set -euo pipefail
fresh=0 list=0 real=0
for arg in "$@"; do
  case "$arg" in
    --fresh-check) fresh=1 ;;
    --real-node) real=1 ;;
    --list) list=1 ;;
    *) echo "usage: $0 [--fresh-check] [--real-node] [--list]" >&2; exit 2 ;;
  esac
done

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ] || [ -x "/usr/sbin/$1" ]; }
need=()
{ have prometheus && have promtool; } || need+=(prometheus)
have ip || need+=(iproute2)
have iptables-restore || need+=(iptables)
[ -s /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
have cc || have gcc || need+=(gcc)
[ -e /usr/include/math.h ] || need+=(libc6-dev)
if [ "$fresh" = 1 ]; then
  have dockerd || need+=(docker.io)
  have debootstrap || need+=(debootstrap)
fi
if [ "$real" = 1 ]; then
  { have containerd && have ctr; } || need+=(containerd)
  have runc || need+=(runc)
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || need+=(containernetworking-plugins)
  { [ "$fresh" = 1 ] || have dockerd; } || need+=(docker.io)
  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)  # static, for the pause binary
fi

if [ "$list" = 1 ]; then
  echo "${need[*]}"
  exit 0
fi
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
  # Debian starts the packaged services; the launcher runs its own Prometheus per cluster and
  # the fresh-machine check its own dockerd (no bridge, no iptables)
  if command -v systemctl >/dev/null 2>&1; then
    for service in prometheus docker; do
      if systemctl is-active --quiet "$service" 2>/dev/null; then
        systemctl disable --now "$service" >/dev/null 2>&1 || true
      fi
    done
  fi
fi
