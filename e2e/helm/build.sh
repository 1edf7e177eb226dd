#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3/cmd/helm at VERSION, from the Go module proxy) into
# ${KVSCALE_CACHE:-~/.cache/kvscale}/helm/<version>/ once; later calls reuse the cache.
# Prints the binary's path on stdout (the chart's tests and `make chart` use it).
set -euo pipefail
cd "$(dirname "$0")"
version=$(cat VERSION)
out="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/helm/${version}"
if [ ! -x "$out/helm" ]; then
  mkdir -p "$out"
  echo "Building helm ${version} into $out" >&2
  start=$(date +%s)
  # as helm's Makefile: the Kubernetes version `helm template` and `helm lint` assume is that of
  # its client-go (v0.37 -> 1.37), not the v1.20 compiled in
  gomod=$(go mod download -json "helm.sh/helm/v3@${version}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  k8s_minor=$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod" | cut -d. -f2)
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${version}"
  for pkg in chartutil lint/rules; do
    ldflags+=" -X helm.sh/helm/v3/pkg/${pkg}.k8sVersionMajor=1"
    ldflags+=" -X helm.sh/helm/v3/pkg/${pkg}.k8sVersionMinor=${k8s_minor}"
  done
  GOBIN="$out/.bin" CGO_ENABLED=0 GOFLAGS=-trimpath go install -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@${version}" >&2
  mv "$out/.bin/helm" "$out/helm"
  rmdir "$out/.bin"
  echo "Built helm in $(( $(date +%s) - start )) s" >&2
fi
echo "$out/helm"
