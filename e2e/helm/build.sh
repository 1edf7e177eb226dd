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
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${version}"
  GOBIN="$out/.bin" CGO_ENABLED=0 GOFLAGS=-trimpath go install -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@${version}" >&2
  mv "$out/.bin/helm" "$out/helm"
  rmdir "$out/.bin"
  echo "Built helm in $(( $(date +%s) - start )) s" >&2
fi
echo "$out/helm"
