#!/usr/bin/env bash
# Builds the kvscale engine image (kvscale/engine) and the operator image (kvscale/operator)
# where no container registry can be reached.
#
# The base image is a Debian root file system made by debootstrap and turned into an image by
# `docker import`, so nothing is pulled from a registry. Python packages come from PyPI through
# `--network host` with the host's CA bundle, which is copied into the builder stage only.
# On an ordinary machine with Docker Hub, skip debootstrap:
#     BASE_IMAGE=python:3.11-slim-bookworm engine-image/build-image.sh
#
# Tags come from pyproject.toml's version, the tag the CRD's default engine image names:
# kvscale/engine:<version> (the CUDA variant: <version>-cuda) and kvscale/operator:<version>.
# Environment: VARIANT=cpu|cuda (default cpu), TAG (default as above), BASE_IMAGE (default: the
# debootstrap image below), DEBIAN_MIRROR, CA_BUNDLE.
set -euo pipefail

cd "$(dirname "$0")/.."
VARIANT=${VARIANT:-cpu}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
[[ -n "$VERSION" ]] || { echo "[build-image] no version in pyproject.toml" >&2; exit 1; }
if [[ "$VARIANT" == cpu ]]; then TAG=${TAG:-$VERSION}; else TAG=${TAG:-$VERSION-$VARIANT}; fi
IMAGE=kvscale/engine
OPERATOR_IMAGE=kvscale/operator:$VERSION
SUITE=bookworm
DEBOOTSTRAP_BASE=kvscale/debian-base:$SUITE
BASE_IMAGE=${BASE_IMAGE:-$DEBOOTSTRAP_BASE}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
WORK=build/engine-image
export DOCKER_BUILDKIT=0  # the classic builder: Debian's docker.io ships without buildx

log() { printf '[build-image] %s\n' "$*" >&2; }

# shellcheck source=../e2e/docker.sh
source e2e/docker.sh

ensure_debootstrap_base() {
    [[ "$BASE_IMAGE" == "$DEBOOTSTRAP_BASE" ]] || return 0
    ensure_debian_image "$DEBOOTSTRAP_BASE" "$SUITE" python3,python3-venv,ca-certificates
}

stage_context() {
    # Only the files git knows about (tracked or not ignored): never .venv or build outputs.
    local ctx="$WORK/context"
    rm -rf "$ctx" && mkdir -p "$ctx"
    git ls-files -co --exclude-standard -- pyproject.toml README.md operator engine-image \
        | tar -c -T - | tar -x -C "$ctx"
    cp "$CA_BUNDLE" "$ctx/ca-bundle.crt"
    echo "$ctx"
}

main() {
    ensure_dockerd
    ensure_debootstrap_base
    [[ "${1:-}" == "--base-only" ]] && return 0
    local ctx
    ctx=$(stage_context)
    log "Building $IMAGE:$TAG (variant $VARIANT) from $BASE_IMAGE"
    docker build --network host \
        --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg VARIANT="$VARIANT" \
        -f engine-image/Dockerfile -t "$IMAGE:$TAG" "$ctx"
    log "Built $IMAGE:$TAG"
    log "Building $OPERATOR_IMAGE from $BASE_IMAGE"
    docker build --network host --build-arg BASE_IMAGE="$BASE_IMAGE" \
        -f operator/Dockerfile -t "$OPERATOR_IMAGE" "$ctx"
    log "Built $OPERATOR_IMAGE"
}

main "$@"
