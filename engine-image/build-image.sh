#!/usr/bin/env bash
# Builds every image of kvscale: the engine image (<registry>/engine), the router image
# (<registry>/router: the router alone, without torch, which the router pods run) and the operator
# image (<registry>/operator), where no container registry can be reached.
#
# The base image is a Debian root file system made by debootstrap and turned into an image by
# `docker import`, so nothing is pulled from a registry. Python packages come from PyPI through
# `--network host` with the host's CA bundle, which is copied into the builder stage only.
# On an ordinary machine with Docker Hub, skip debootstrap:
#     BASE_IMAGE=python:3.11-slim-bookworm engine-image/build-image.sh
#
# REGISTRY (default kvscale) and TAG (default: pyproject.toml's version, the tag the operator's
# default images name) set every image's name: <registry>/engine:<tag> (the CUDA variant:
# <tag>-cuda), <registry>/router:<tag> and <registry>/operator:<tag> (no torch in those two, so
# VARIANT leaves them alone); manifests/base/kustomization.yaml's `images:` is where an install
# names them. Each image carries the OCI labels org.opencontainers.image.source (SOURCE,
# default: the git remote `origin`), .version (the package's) and .revision (the git commit).
# Environment: REGISTRY, TAG, VARIANT=cpu|cuda (default cpu), SOURCE, BASE_IMAGE (default: the
# debootstrap image below), DEBIAN_MIRROR, CA_BUNDLE, KVSCALE_CACHE (the build lock's folder,
# default ~/.cache/kvscale), IMAGES (which to build, default "engine router operator"; the real
# node's tier builds the operator and the router: e2e/real-node/build-images.sh).
# `--dry-run` prints the build commands without building; `--base-only` builds only the base.
set -euo pipefail

cd "$(dirname "$0")/.."
VARIANT=${VARIANT:-cpu}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
[[ -n "$VERSION" ]] || { echo "[build-image] no version in pyproject.toml" >&2; exit 1; }
REGISTRY=${REGISTRY:-kvscale}
TAG=${TAG:-$VERSION}
if [[ "$VARIANT" == cpu ]]; then ENGINE_TAG=$TAG; else ENGINE_TAG=$TAG-$VARIANT; fi
IMAGE=$REGISTRY/engine:$ENGINE_TAG
ROUTER_IMAGE=$REGISTRY/router:$TAG
OPERATOR_IMAGE=$REGISTRY/operator:$TAG
SOURCE=${SOURCE:-$(git remote get-url origin 2>/dev/null || true)}
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
SUITE=bookworm
DEBOOTSTRAP_BASE=kvscale/debian-base:$SUITE
BASE_IMAGE=${BASE_IMAGE:-$DEBOOTSTRAP_BASE}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
WORK=build/engine-image
LOCKS=${KVSCALE_CACHE:-$HOME/.cache/kvscale}
export DOCKER_BUILDKIT=0  # the classic builder: Debian's docker.io ships without buildx
LABELS=(
    --label "org.opencontainers.image.source=$SOURCE"
    --label "org.opencontainers.image.version=$VERSION"
    --label "org.opencontainers.image.revision=$REVISION"
    --label "org.opencontainers.image.licenses=Apache-2.0"
)

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

build() {  # name image dockerfile context [docker build arguments...]
    local name=$1 image=$2 dockerfile=$3 ctx=$4
    shift 4
    local cmd=(docker build --network host --build-arg BASE_IMAGE="$BASE_IMAGE" "$@" "${LABELS[@]}"
        --label "io.kvscale.image=$name" -f "$dockerfile" -t "$image" "$ctx")
    if [[ -n "$DRY_RUN" ]]; then
        printf '%q ' "${cmd[@]}" && echo
        return 0
    fi
    log "Building $image from $BASE_IMAGE"
    "${cmd[@]}"
    log "Built $image"
}

# prune_earlier_builds: what earlier builds left untagged, about 600 MB a commit (the router's and
# the operator's venvs) and a 5.7 GB venv each time the engine's dependencies change, which
# filled a CI machine's disk: the images whose tags moved on (labelled io.kvscale.image) and the
# builder stages' results (labelled io.kvscale.stage, the engine's per variant), but those the
# next build reuses from the cache: the newest untagged result of each stage whose result nothing
# is built on, and no engine-deps result with a child (the kept engine-app's). Removing an image
# removes its untagged parents that nothing else is built on. Other images, tagged or not, stay.
# Builds on one Docker engine take turns (the lock in main), so none prunes another's stages.
prune_earlier_builds() {
    local stage keep ids
    for stage in engine-app-{cpu,cuda} router-builder operator-builder engine-deps-{cpu,cuda}; do
        if [[ "$stage" == engine-deps-* ]]; then keep=0; else keep=1; fi
        # newest first; "dangling": untagged, and no image built on it
        mapfile -t ids < <(docker images -q --filter dangling=true \
            --filter "label=io.kvscale.stage=$stage" | tail -n +$((keep + 1)))
        ((${#ids[@]} == 0)) || docker rmi "${ids[@]}" >/dev/null \
            || log "Could not remove every earlier $stage result"
    done
    docker image prune --force --filter label=io.kvscale.image >/dev/null
}

main() {
    DRY_RUN=
    [[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
    [[ -n "$SOURCE" ]] || log "No SOURCE and no git remote origin: org.opencontainers.image.source is empty"
    local ctx=$WORK/context
    if [[ -z "$DRY_RUN" ]]; then
        # one build at a time on this machine's Docker engine, from any checkout: CI builds the
        # engine image beside the first tiers, and `make test-real-engine` (its `image`
        # prerequisite) waits for it here; a build's pruning never meets another's stages
        mkdir -p "$WORK" "$LOCKS"
        exec 9>"$LOCKS/build-image.lock"
        flock 9
        ensure_dockerd
        ensure_debootstrap_base
        [[ "${1:-}" == "--base-only" ]] && return 0
        ctx=$(stage_context)
    fi
    for name in ${IMAGES:-engine router operator}; do
        case "$name" in
            engine) build engine "$IMAGE" engine-image/Dockerfile "$ctx" --build-arg VARIANT="$VARIANT" ;;
            router) build router "$ROUTER_IMAGE" engine-image/router.Dockerfile "$ctx" ;;
            operator) build operator "$OPERATOR_IMAGE" operator/Dockerfile "$ctx" ;;
            *) log "IMAGES names engine, router and operator, not $name"; return 1 ;;
        esac
    done
    [[ -n "$DRY_RUN" ]] || prune_earlier_builds
}

main "$@"
