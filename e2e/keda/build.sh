#!/usr/bin/env bash
# Builds KEDA (github.com/kedacore/keda/v2 at VERSION, from the Go module proxy): its operator
# (cmd/operator) and metrics API server (cmd/adapter) into
# ${KVSCALE_CACHE:-~/.cache/kvscale}/keda/<version>/ once, with its CRDs (config/crd/bases) in
# crds/; later calls reuse the cache. Prints the folder on stdout (e2e/tests/test_keda.py and
# bench/cluster_vs_keda.py take it from KVSCALE_KEDA).
set -euo pipefail
cd "$(dirname "$0")"
version=$(cat VERSION)
out="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/keda/${version}"
mkdir -p "$(dirname "$out")"
# one build at a time (CI starts one early, beside the first tiers; make test-e2e then waits)
exec 9>"$out.lock"
flock 9
if [ ! -x "$out/keda-adapter" ]; then
  mkdir -p "$out/.build"
  echo "Building KEDA ${version} into $out" >&2
  start=$(date +%s)
  # go install refuses a module with replace directives: build inside the downloaded source
  src=$(go mod download -json "github.com/kedacore/keda/v2@${version}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${version}"
  ldflags+=" -X github.com/kedacore/keda/v2/version.GitCommit=module-proxy"
  (cd "$src" && CGO_ENABLED=0 GOFLAGS="-trimpath -mod=mod" go build -ldflags "$ldflags" \
    -o "$out/.build/" ./cmd/operator ./cmd/adapter) >&2
  rm -rf "$out/crds"
  cp -r "$src/config/crd/bases" "$out/crds"
  chmod -R u+w "$out/crds"
  mv "$out/.build/operator" "$out/keda-operator"
  mv "$out/.build/adapter" "$out/keda-adapter"
  rmdir "$out/.build"
  echo "Built KEDA in $(( $(date +%s) - start )) s" >&2
fi
echo "$out"
