# Docker helpers shared by engine-image/build-image.sh and e2e/fresh-machine.sh; source it.
# No registry can be reached here: base images are Debian root file systems made by debootstrap
# from Debian's archive and turned into images by `docker import`. Docker's engine is started
# without a bridge or iptables rules, as this machine's network allows.
#
# The caller sets WORK (a folder for logs and the root file system) and may set DEBIAN_MIRROR.

DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

docker_log() { printf '[%s] %s\n' "$(basename "$0" .sh)" "$*" >&2; }

wait_for_docker() {
    for _ in $(seq 1 120); do
        docker info >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    docker_log "Docker did not come up; see $WORK/dockerd.log"
    return 1
}

# ensure_dockerd: a running Docker engine, started here when none answers
ensure_dockerd() {
    docker info >/dev/null 2>&1 && return 0
    command -v dockerd >/dev/null || { docker_log "dockerd not found: apt-get install docker.io"; return 1; }
    docker_log "Started dockerd (no bridge, no iptables)"
    mkdir -p "$WORK"
    nohup dockerd --bridge=none --iptables=false >"$WORK/dockerd.log" 2>&1 &
    wait_for_docker
}

# ensure_debian_image TAG SUITE PACKAGES: the image TAG, bootstrapped once from Debian's archive
# (minbase plus the comma-separated PACKAGES); kept while the tag exists
ensure_debian_image() {
    local tag=$1 suite=$2 packages=$3
    docker image inspect "$tag" >/dev/null 2>&1 && return 0
    command -v debootstrap >/dev/null || { docker_log "debootstrap not found: apt-get install debootstrap"; return 1; }
    local rootfs="$WORK/rootfs"
    rm -rf "$rootfs" && mkdir -p "$WORK"  # a fresh clone has no build/ folder yet
    docker_log "Bootstrapping Debian $suite ($packages) into $rootfs"
    debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$DEBIAN_MIRROR" \
        >"$WORK/debootstrap.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
    rm -rf "$rootfs"
    docker_log "Imported $tag"
}
