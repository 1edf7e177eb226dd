#!/usr/bin/env bash
# The fresh-machine check: what a new user meets. A clean clone of this checkout's HEAD in a fresh
# Debian 12 container that holds only what a user brings: Python 3.11 (with venv), git and make
# from Debian, and Go (this machine's toolchain, mounted read-only). There it runs
#     make prereqs lint typecheck imports test-unit test-engine-installs
# (the engine tests that need each thing the install brings; `make test` ran the whole engine
# tier on the same commit), so a missing install step (a system package that only a
# developer's machine happened to have)
# fails here, as it would for the user, instead of hiding behind a warm CI machine.
#
# Caches hold downloads only, never installed state, so a rerun costs minutes, not a cold
# download of torch: a wheelhouse of everything pyproject.toml names (`pip download`, kept per
# content of pyproject.toml under ~/.cache/kvscale/wheels/; pip's own HTTP cache stays empty
# behind this network's proxy), offered to the container's pip as find-links beside PyPI, and
# Go's module cache. A package pyproject.toml does not name is not in the wheelhouse, so the
# cache cannot hide a missing dependency either.
# Docker's engine is started here when none runs (no bridge, no iptables); the base image is
# made once with debootstrap from Debian's archive (e2e/docker.sh).
#
# `--prepare` makes the base image and the wheelhouse and returns (network and disk, little CPU):
# CI runs it beside `make test`, so the check itself then costs only the container's run.
#
# Environment: FRESH_TARGETS (the make targets; default above), FRESH_KEEP=1 (keep the container
# for a look afterwards), DEBIAN_MIRROR, CA_BUNDLE (the CA bundle this network needs).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=${FRESH_TARGETS:-prereqs lint typecheck imports test-unit test-engine-installs}
SUITE=bookworm
# what a user has: Python 3.11 with venv, git, make (and Go, mounted below); nothing else
PACKAGES=python3,python3-venv,git,make,ca-certificates
IMAGE=kvscale/debian-fresh:$SUITE-$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-12)
WORK=build/fresh-machine
CACHE=${KVSCALE_CACHE:-$HOME/.cache/kvscale}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

# shellcheck source=docker.sh
source e2e/docker.sh
log() { docker_log "$@"; }

# wheelhouse: the folder of wheels for pyproject.toml as it is now (downloaded once per content)
wheelhouse() {
    local root=$CACHE/wheels key dir
    key=$(sha256sum pyproject.toml | cut -c1-16)
    dir=$root/$key
    if [ ! -e "$dir/.complete" ]; then
        rm -rf "$root" && mkdir -p "$dir"  # one wheelhouse: the older ones are stale
        log "Downloading the wheels pyproject.toml names into $dir"
        python3 -m pip download --quiet --disable-pip-version-check -d "$dir" \
            '.[dev]' pip 'setuptools>=77' wheel >&2
        touch "$dir/.complete"
    fi
    echo "$dir"
}

go_root() {
    local go
    go=$(command -v go || echo /usr/local/go/bin/go)
    [ -x "$go" ] || { log "Go not found: the check mounts this machine's Go into the container"; exit 1; }
    "$go" env GOROOT
}

prepare() {
    wheelhouse >/dev/null
    ensure_dockerd
    ensure_debian_image "$IMAGE" "$SUITE" "$PACKAGES"
}

main() {
    if [ "${1:-}" = --prepare ]; then
        prepare
        return
    fi
    local start sha goroot wheels go_mods name status
    start=$(date +%s)
    mkdir -p "$WORK"
    sha=$(git rev-parse HEAD)
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
        log "Uncommitted changes are not in the check: it clones HEAD ($sha)"
    fi
    goroot=$(go_root)
    wheels=$(wheelhouse)
    go_mods=$(GOFLAGS= "$goroot/bin/go" env GOMODCACHE)
    mkdir -p "$go_mods"
    ensure_dockerd
    ensure_debian_image "$IMAGE" "$SUITE" "$PACKAGES"
    name=kvscale-fresh-$$
    log "Running make $TARGETS on a clean clone of $sha in $IMAGE"
    local ca=/usr/local/share/ca-certificates/network.crt
    set +e
    docker run --name "$name" --network host --init --shm-size 2g \
        -v "$(git rev-parse --path-format=absolute --git-common-dir)":/src.git:ro \
        -v "$goroot":/usr/local/go:ro \
        -v "$wheels":/wheels:ro -e PIP_FIND_LINKS=/wheels \
        -v "$go_mods":/root/go/pkg/mod \
        -v "$(readlink -f "$CA_BUNDLE")":"$ca":ro \
        -e PIP_CERT="$ca" -e SSL_CERT_FILE="$ca" -e REQUESTS_CA_BUNDLE="$ca" \
        -e GIT_SSL_CAINFO="$ca" -e CURL_CA_BUNDLE="$ca" -e PIP_DEFAULT_TIMEOUT=180 \
        -e PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        -e SHA="$sha" -e TARGETS="$TARGETS" \
        "$IMAGE" bash -euo pipefail -c '
            git clone --quiet --no-checkout /src.git /root/kvscale
            cd /root/kvscale
            git checkout --quiet --detach "$SHA"
            echo "[fresh-machine] $(python3 -V), $(go version), $(git --version), $(make --version | head -n1)"
            echo "[fresh-machine] promtool: $(command -v promtool || echo absent), dockerd: $(command -v dockerd || echo absent)"
            make $TARGETS
        '
    status=$?
    set -e
    [ "${FRESH_KEEP:-0}" = 1 ] || docker rm -f "$name" >/dev/null 2>&1 || true
    log "make $TARGETS on a fresh Debian $SUITE: exit $status after $(( $(date +%s) - start )) s"
    return "$status"
}

main "$@"
