#!/usr/bin/env bash
# Regenerates go.mod/go.sum for the control-plane wrapper module.
# k8s.io/kubernetes replaces its staging modules with ./staging paths, which `go install pkg@v`
# refuses; this module requires k8s.io/kubernetes and maps every staging module to its published
# v0.X.Y tag, reading the list from upstream's own go.mod so it never drifts.
set -euo pipefail
cd "$(dirname "$0")"
K8S_VERSION=${K8S_VERSION:-$(cat VERSION)}
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
upstream=$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
{
  echo "module kvscale.io/e2e/k8sbin"
  echo
  grep '^go ' "$upstream"
  echo
  echo "require k8s.io/kubernetes ${K8S_VERSION}"
  echo
  echo "replace ("
  grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging/' "$upstream" | awk -v v="$STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} > go.mod
rm -f go.sum
go mod tidy
