#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler and etcd (or the binaries named as
# arguments: `build.sh kubelet` for the real node, docs/real-node.md) from Go modules into
# ${KVSCALE_CACHE:-~/.cache/kvscale}/k8s/<version>/ once; later calls reuse the cache.
# Prints the binary folder on stdout.
set -euo pipefail
cd "$(dirname "$0")"
version=$(cat VERSION)
out="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/k8s/${version}"
bins=(kube-apiserver kube-controller-manager kube-scheduler etcd)
[ $# -gt 0 ] && bins=("$@")
missing=0
for b in "${bins[@]}"; do [ -x "$out/$b" ] || missing=1; done
if [ "$missing" = 1 ]; then
  mkdir -p "$out"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${version} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)"
  start=$(date +%s)
  for b in "${bins[@]}"; do
    [ -x "$out/$b" ] && continue
    echo "Building $b ${version} into $out" >&2
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" "./cmd/$b" >&2
    mv "$out/$b.tmp" "$out/$b"
  done
  echo "Built ${bins[*]} in $(( $(date +%s) - start )) s" >&2
fi
echo "$out"
