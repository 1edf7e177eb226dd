#!/usr/bin/env bash
# Checks what `make test` and `make demo` need before they start, and prints everything missing
# at once (exit 1), or nothing but notes (exit 0):
#   - Python >= 3.11 ($PY, default python3) with venv, for .venv;
#   - a Go toolchain at least as new as e2e/k8sbin/go.mod's `go` line, unless the control-plane
#     binaries and helm (e2e/helm/build.sh) are already built in the cache;
#   - root: the local cluster puts pods in network namespaces (ip netns, veth, a bridge), and
#     `make system-deps` installs Debian packages.
# The system packages that `make system-deps` installs (Prometheus for promtool and the cluster,
# iproute2, iptables; with FRESH=1 Docker's engine and debootstrap for `make test-fresh`) are
# named too: as a note when this machine can install them itself (root and apt-get), else as
# missing.
# It also notes (without failing) a vLLM venv not yet built: only the vLLM tests need it.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
missing=()

# version_ge A B: A >= B for dotted versions
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

if ! command -v "$PY" >/dev/null 2>&1; then
  missing+=("Python >= 3.11 ($PY not found; install python3.11 and python3.11-venv, or set PY=)")
elif ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  missing+=("Python >= 3.11 ($PY is $("$PY" -V 2>&1 | head -n1); install python3.11, or set PY=python3.11)")
elif ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  missing+=("the venv module of $PY (apt-get install python3-venv)")
fi

go_needed=$(sed -n 's/^go \([0-9.]*\)$/\1/p' e2e/k8sbin/go.mod)
cache="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/k8s/$(cat e2e/k8sbin/VERSION)"
built=1
for b in kube-apiserver kube-controller-manager kube-scheduler etcd; do
  [ -x "$cache/$b" ] || built=0
done
[ -x "${KVSCALE_CACHE:-$HOME/.cache/kvscale}/helm/$(cat e2e/helm/VERSION)/helm" ] || built=0
if [ "$built" = 0 ]; then
  go=$(command -v go || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; })
  if [ -z "$go" ]; then
    missing+=("Go >= $go_needed to build the control plane and helm once (https://go.dev/dl/; none found)")
  else
    have=$("$go" env GOVERSION 2>/dev/null | sed 's/^go//')
    version_ge "$have" "$go_needed" \
      || missing+=("Go >= $go_needed to build the control plane and helm once (found $have at $go)")
  fi
fi

if [ "$(id -u)" != 0 ]; then
  missing+=("root: the local cluster runs pods in network namespaces (run: sudo make ...)")
fi

fresh_flag=()
[ "${FRESH:-0}" = 1 ] && fresh_flag=(--fresh-check)
packages=$(e2e/install-system-deps.sh --list "${fresh_flag[@]}")
if [ -n "$packages" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "System packages to install (make system-deps does it): $packages" >&2
  else
    missing+=("system packages: $packages (apt-get install -y $packages, as root)")
  fi
fi

vllm="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/vllm/$(cat e2e/vllm/VERSION)"
if [ ! -f "$vllm/.installed-stamp" ]; then
  echo "Note: the vLLM venv ($vllm) is to be built by make vllm (only the vLLM tests need it)" >&2
fi

if [ "${#missing[@]}" -gt 0 ]; then
  echo "Missing prerequisites:" >&2
  printf '  - %s\n' "${missing[@]}" >&2
  exit 1
fi
