#!/usr/bin/env bash
# Builds the images the real node imports without a registry (docs/real-node.md), as
# `docker save` tarballs for `ctr -n k8s.io images import`, each once, and prints their folders
# (a `:`-separated list, what $KVSCALE_REAL_NODE_IMAGES holds):
#   ${KVSCALE_CACHE:-~/.cache/kvscale}/real-node-images/<hash>/, the hash covering this script,
#   the pause source and the busybox-static version:
#     pause.tar    registry.k8s.io/pause:3.10: upstream's pause.c from the k8s.io/kubernetes
#                  module, compiled static (containerd's sandbox_image)
#     busybox.tar  kvscale.local/busybox:1.35.0: Debian's busybox-static with every applet linked
#                  in /bin, for the tier's test pods (sh, id, httpd, wget, nslookup...)
#   .../real-node-images/kvscale-<hash>/{operator,router}.tar: kvscale/operator:<version> and
#     kvscale/router:<version>, built by engine-image/build-image.sh (IMAGES="operator router")
#     from the files of the source tree that go into them (pyproject.toml, README.md, operator/,
#     engine-image/), which the hash covers with the build scripts: a change to any of them
#     rebuilds them, nothing else does.
# One build at a time (a lock): CI starts it beside the first tiers, `make test-real` waits on it.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${KVSCALE_CACHE:-$HOME/.cache/kvscale}/real-node-images"
mkdir -p "$cache"
exec 9>"$cache/build.lock"
flock 9
pause_c="$(cd k8sbin && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
busybox_version=$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: //p')
if [ -z "$busybox_version" ] || [ "$busybox_version" = "(none)" ]; then
  apt-get update -qq >&2  # a machine whose package lists were never fetched (or were cleaned)
  busybox_version=$(apt-cache policy busybox-static | sed -n 's/^ *Candidate: //p')
fi
[ -n "$busybox_version" ] && [ "$busybox_version" != "(none)" ] || { echo "[real-node] busybox-static is not known to apt" >&2; exit 1; }
hash=$( { cat real-node/build-images.sh "$pause_c"; echo "$busybox_version"; } | sha256sum | cut -c1-16)
out="$cache/$hash"
if [ ! -s "$out/pause.tar" ] || [ ! -s "$out/busybox.tar" ]; then
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  # shellcheck source=../docker.sh
  source docker.sh
  ensure_dockerd
  mkdir -p "$WORK/pause/root" "$WORK/busybox/root/bin" "$WORK/busybox/root/etc" "$WORK/busybox/root/tmp"
  gcc -Os -static -Wall -DVERSION=v3.10-kvscale -o "$WORK/pause/root/pause" "$pause_c"
  strip "$WORK/pause/root/pause"
  (cd "$WORK" && apt-get download "busybox-static=$busybox_version" >/dev/null 2>&1)
  dpkg-deb -x "$WORK"/busybox-static_*.deb "$WORK/busybox/deb"
  cp "$WORK/busybox/deb/bin/busybox" "$WORK/busybox/root/bin/"
  for applet in $("$WORK/busybox/deb/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -s busybox "$WORK/busybox/root/bin/$applet"
  done
  echo 'nobody:x:65534:65534:nobody:/:/bin/sh' >"$WORK/busybox/root/etc/passwd"
  echo 'nogroup:x:65534:' >"$WORK/busybox/root/etc/group"
  tar -C "$WORK/pause/root" -c . | docker import --change 'ENTRYPOINT ["/pause"]' \
    --change 'USER 65535:65535' - registry.k8s.io/pause:3.10 >/dev/null
  tar -C "$WORK/busybox/root" -c . | docker import --change 'ENV PATH=/bin' \
    --change 'CMD ["/bin/sh"]' - kvscale.local/busybox:1.35.0 >/dev/null
  mkdir -p "$out"
  docker save registry.k8s.io/pause:3.10 -o "$out/pause.tar.tmp"
  docker save kvscale.local/busybox:1.35.0 -o "$out/busybox.tar.tmp"
  docker rmi registry.k8s.io/pause:3.10 kvscale.local/busybox:1.35.0 >/dev/null
  mv "$out/pause.tar.tmp" "$out/pause.tar"
  mv "$out/busybox.tar.tmp" "$out/busybox.tar"
  echo "[real-node] Built the pause and busybox images into $out" >&2
fi
# kvscale's operator and router images, from what of the tree goes into them (git's view: tracked
# or not ignored)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' ../pyproject.toml)
sources=$(cd .. && git ls-files -co --exclude-standard -- pyproject.toml README.md operator engine-image \
  | sort | xargs sha256sum | sha256sum)
kv_hash=$( { cat real-node/build-images.sh ../engine-image/build-image.sh docker.sh;
  echo "$version $sources"; } | sha256sum | cut -c1-16)
kvscale="$cache/kvscale-$kv_hash"
if [ ! -s "$kvscale/operator.tar" ] || [ ! -s "$kvscale/router.tar" ]; then
  (cd .. && IMAGES="operator router" TAG="$version" REGISTRY=kvscale engine-image/build-image.sh) >&2
  mkdir -p "$kvscale"
  for name in operator router; do
    docker save "kvscale/$name:$version" -o "$kvscale/$name.tar.tmp"
    mv "$kvscale/$name.tar.tmp" "$kvscale/$name.tar"
  done
  echo "[real-node] Saved kvscale/operator:$version and kvscale/router:$version into $kvscale" >&2
  # one copy kept (650 MB a tree): the builds of older trees go
  find "$cache" -maxdepth 1 -name 'kvscale-*' ! -path "$kvscale" -exec rm -rf {} +
fi
echo "$out:$kvscale"
