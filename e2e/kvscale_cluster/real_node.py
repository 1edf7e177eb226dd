"""A real node in the local cluster: the upstream kubelet over a private containerd, runc and CNI.

The process kubelet runs pods as local processes; this node runs them as containers, so what a
real node enforces (the image's contents, the container's user, ``readOnlyRootFilesystem``,
projected service-account tokens, cgroups) is enforced. Everything lives under the cluster's
folder in ``real-node/``: containerd's root, state, sockets and runc root (never Docker's), the
CNI config (Debian's bridge and host-local plugins on the cluster's own bridge, addresses
``.192-.254`` of its subnet, below which the process kubelet stays), the kubelet's root,
certificates and pod logs. Images come from ``ctr images import`` of the tarballs
``e2e/real-node/build-images.sh`` builds (no registry). The node registers with the taint
``kvscale.dev/node-kind=real:NoSchedule``: only pods that tolerate it land there, so a pod whose
image only the process kubelet has (the engine's) is never scheduled onto it. What each setting
is for, and the errors met without it, are in docs/real-node.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import yaml

from . import process
from .kube_api import MERGE, KubeApi
from .kubeconfig import write_kubeconfig
from .netns import bridge_name
from .pki import Pki, issue_certificate
from .ports import free_port
from .wait import GiveUp, wait_for

NAME = "kvscale-real-1"
LABEL = ("kvscale.dev/node-kind", "real")
FIRST_ADDRESS = 192  # host-local's range starts here; netns.POD_INDEXES ends below it
IMAGES_ENV = "KVSCALE_REAL_NODE_IMAGES"
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
CNI_BIN = Path("/usr/lib/cni")
CGROUPS = Path("/sys/fs/cgroup")
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
TAINT = {"key": LABEL[0], "value": LABEL[1], "effect": "NoSchedule"}
TOLERATION = {"key": LABEL[0], "operator": "Equal", "value": LABEL[1], "effect": "NoSchedule"}
COMPONENTS = ("real-kubelet", "containerd")
# evictionHard's nodefs/imagefs.available: below it, the kubelet deletes every image no container
# uses (the sandbox's pause among them; containerd 1.6 pins none) and evicts pods
EVICTION_FREE = 0.01
SPARE = 2 << 30  # for containers' writable layers, emptyDirs and logs


class RealNodeError(RuntimeError):
    """The real node's infrastructure is missing or did not come up."""


@dataclass(frozen=True)
class RealNode:
    """The paths of one cluster's real node (under ``<cluster>/real-node``)."""

    root: Path

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    def ctr(self, *args: str, stdin: IO[bytes] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd, in the CRI's namespace."""
        argv = ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args]
        return subprocess.run(argv, stdin=stdin, capture_output=True, text=True, check=False)

    def ctr_checked(self, *args: str) -> str:
        done = self.ctr(*args)
        if done.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout


def images_dirs() -> list[Path]:
    """The folders of image tarballs (``$KVSCALE_REAL_NODE_IMAGES``, a ``:``-separated list that
    ``make`` sets from build-images.sh), one of them with the sandbox image's pause.tar."""
    configured = os.environ.get(IMAGES_ENV) or ""
    folders = [Path(p) for p in configured.split(os.pathsep) if p]
    if not any((folder / "pause.tar").is_file() for folder in folders):
        raise RealNodeError(
            f"${IMAGES_ENV} names no folder with pause.tar ({configured!r}): "
            "run e2e/real-node/build-images.sh (make test-real does)"
        )
    return folders


def _containerd_config(node: RealNode) -> str:
    base = node.root / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    runc = f"{cri}.containerd.runtimes.runc"
    return f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"
[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{runc}]
  runtime_type = "io.containerd.runc.v2"
[{runc}.options]
  SystemdCgroup = false
  BinaryName = "runc"
  Root = "{base / "runc"}"
[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{node.root / "cni"}"
"""


def _cni_config(node: RealNode, slot: int, host_ip: str) -> str:
    subnet = host_ip.rsplit(".", 1)[0]
    ipam = {
        "type": "host-local",
        "ranges": [
            [
                {
                    "subnet": f"{subnet}.0/24",
                    "rangeStart": f"{subnet}.{FIRST_ADDRESS}",
                    "rangeEnd": f"{subnet}.254",
                    "gateway": host_ip,
                }
            ]
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": host_ip}],
        "dataDir": str(node.root / "ipam"),
    }
    bridge = {
        "type": "bridge",
        "bridge": bridge_name(slot),
        "isGateway": False,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": ipam,
    }
    conflist = {"cniVersion": "1.0.0", "name": "kvscale", "plugins": [bridge]}
    return json.dumps(conflist, indent=2)


def cgroup_root(slot: int) -> str:
    """The cgroup the node's pods live under: one per cluster, so that two real nodes (two
    clusters at once) never see each other's pod cgroups as orphans to clean up."""
    return f"/kvscale-real-{slot}"


def _hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: each v1 controller, ``name=systemd`` and ``unified`` on
    this machine's hybrid layout; ``/sys/fs/cgroup`` itself where it is cgroup v2 only."""
    if (CGROUPS / "cgroup.controllers").exists():
        return [CGROUPS]
    return [p for p in CGROUPS.iterdir() if (p / "cgroup.procs").exists()]


def _make_cgroup_root(slot: int) -> None:
    for hierarchy in _hierarchies():
        (hierarchy / cgroup_root(slot).lstrip("/")).mkdir(exist_ok=True)


def _remove_cgroup_root(slot: int) -> None:
    """Remove the node's (by now empty) cgroups, deepest first."""
    for hierarchy in _hierarchies():
        top = hierarchy / cgroup_root(slot).lstrip("/")
        if not top.is_dir():
            continue
        below = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for group in [*below, top]:
            with contextlib.suppress(OSError):
                group.rmdir()


def _kubelet_config(node: RealNode, pki: Pki, host_ip: str, slot: int) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupRoot": cgroup_root(slot),
        "failCgroupV1": False,  # this machine has cgroup v1; 1.35+ refuse it by default
        "cgroupDriver": "cgroupfs",  # containerd 1.6 cannot tell the kubelet (no RuntimeConfig)
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "imageServiceEndpoint": f"unix://{node.socket}",
        "address": host_ip,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        "tlsCertFile": str(node.root / "pki" / "serving.crt"),
        "tlsPrivateKeyFile": str(node.root / "pki" / "serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [host_ip],
        "clusterDomain": "cluster.local",
        "failSwapOn": False,
        "podLogsDir": str(node.pod_logs),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": f"{EVICTION_FREE:.0%}",
            "imagefs.available": f"{EVICTION_FREE:.0%}",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "/etc/resolv.conf",
    }
    return yaml.safe_dump(config, sort_keys=False)


def space_needed(image_bytes: int, disk_bytes: int) -> int:
    """The free space the node's disk needs before ``image_bytes`` of images are imported:
    twice that (containerd keeps the layers it imports and unpacks them into snapshots), above
    the kubelet's eviction threshold, with ``SPARE`` left for the pods."""
    return 2 * image_bytes + int(EVICTION_FREE * disk_bytes) + SPARE


def check_space(root: Path, tarballs: list[Path], docker_images: tuple[str, ...]) -> None:
    """Refuse to start a node whose images would leave its disk under the eviction threshold:
    the kubelet would delete the pause image and every sandbox would fail to pull it, which
    surfaces minutes later as pods that never start (CI's disk, shared, once did)."""
    sizes = [t.stat().st_size for t in tarballs] + [docker_image_size(i) for i in docker_images]
    disk = shutil.disk_usage(root)
    needed = space_needed(sum(sizes), disk.total)
    if disk.free < needed:
        gib = 1 << 30
        raise RealNodeError(
            f"The real node needs {needed / gib:.1f} GiB free under {root} for its images "
            f"({sum(sizes) / gib:.1f} GiB, held twice by containerd) above the kubelet's "
            f"{EVICTION_FREE:.0%} eviction threshold; {disk.free / gib:.1f} GiB are free"
        )


def docker_image_size(image: str) -> int:
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RealNodeError(f"docker image inspect {image}: {done.stderr.strip()} (make image)")
    return int(done.stdout)


def _credentials(node: RealNode, pki: Pki, api_url: str, host_ip: str) -> Path:
    """The kubelet's client certificate (``system:node:<name>`` in ``system:nodes``), its
    serving certificate for the bridge address, and its kubeconfig."""
    certs = node.root / "pki"
    certs.mkdir(parents=True, exist_ok=True)
    user = f"system:node:{NAME}"
    issue_certificate(pki, certs / "client.crt", certs / "client.key", user, ["system:nodes"], [])
    issue_certificate(pki, certs / "serving.crt", certs / "serving.key", NAME, [], [host_ip])
    path = node.root / "kubeconfig"
    write_kubeconfig(path, api_url, pki.ca_cert, "", user)
    config = yaml.safe_load(path.read_text())
    config["users"][0]["user"] = {
        "client-certificate": str(certs / "client.crt"),
        "client-key": str(certs / "client.key"),
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def grant_node_role(api: KubeApi) -> None:
    """Bind the ``system:node`` ClusterRole to ``system:nodes`` (the API server authorises with
    RBAC only, without the Node authorizer, whose absence leaves that role unbound)."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kvscale:real-node"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:node",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
        ],
    }
    api.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)


def publish_api_endpoint(api: KubeApi, api_url: str) -> None:
    """Back the ``kubernetes`` Service with the API server's bridge address: a real kubelet
    gives containers ``KUBERNETES_SERVICE_HOST`` = its ClusterIP (the process kubelet names the
    API server directly), and the API server publishes no endpoints itself here
    (``--endpoint-reconciler-type=none``, for the loopback network's sake)."""
    host, port = api_url.removeprefix("https://").rsplit(":", 1)
    labels = {
        "kubernetes.io/service-name": "kubernetes",
        "endpointslice.kubernetes.io/managed-by": "kvscale-real-node",
    }
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": labels},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": int(port), "protocol": "TCP"}],
    }
    api.post("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", slice_)


def start(
    root: Path,
    pki: Pki,
    api_url: str,
    host_ip: str,
    slot: int,
    bin_dir: Path,
    logs: Path,
    docker_images: tuple[str, ...] = (),
) -> list[process.Component]:
    """Write the node's configs, start containerd, import the images (the tarballs, then
    ``docker_images`` straight from Docker's engine) and start the kubelet."""
    kubelet_bin = bin_dir / "kubelet"
    if not kubelet_bin.is_file():
        raise RealNodeError(f"No kubelet in {bin_dir}: run e2e/k8sbin/build.sh kubelet")
    tarballs = sorted(t for folder in images_dirs() for t in folder.glob("*.tar"))
    node = RealNode(root)
    for sub in ("containerd", "cni", "pki", "kubelet"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    check_space(root, tarballs, docker_images)
    (root / "containerd" / "config.toml").write_text(_containerd_config(node))
    (root / "cni" / "10-kvscale.conflist").write_text(_cni_config(node, slot, host_ip))
    (root / "kubelet" / "config.yaml").write_text(_kubelet_config(node, pki, host_ip, slot))
    _make_cgroup_root(slot)
    kubeconfig = _credentials(node, pki, api_url, host_ip)
    config = root / "containerd" / "config.toml"
    containerd = process.start("containerd", ["containerd", "--config", str(config)], logs)
    started = [containerd]
    try:
        wait_for(lambda: _containerd_up(node, containerd), 30, "containerd's socket")
        for tarball in tarballs:
            node.ctr_checked("images", "import", str(tarball))
        for image in docker_images:
            import_from_docker(node, image)
        argv = [
            str(kubelet_bin),
            f"--config={root / 'kubelet' / 'config.yaml'}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={root / 'kubelet' / 'root'}",
            f"--cert-dir={root / 'pki'}",
            f"--hostname-override={NAME}",
            f"--node-ip={host_ip}",
            f"--node-labels={LABEL[0]}={LABEL[1]}",
            f"--register-with-taints={TAINT['key']}={TAINT['value']}:{TAINT['effect']}",
            "--v=1",
        ]
        started.append(process.start("real-kubelet", argv, logs))
    except BaseException:
        stop(root, slot, {c.name: c.pid for c in started})
        raise
    return started


def import_from_docker(node: RealNode, image: str) -> None:
    """``docker save IMAGE | ctr images import -``: a large image (the engine's, 5.9 GB) goes
    into the node's content store without a tarball on disk beside it."""
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    try:
        done = node.ctr("images", "import", "-", stdin=save.stdout)
    finally:
        if save.stdout is not None:
            save.stdout.close()
        saved = save.wait()
    if saved != 0 or done.returncode != 0:
        raise RealNodeError(
            f"docker save {image} | ctr images import - failed ({saved}, {done.returncode}): "
            f"{done.stderr.strip()} (is the image built? make image)"
        )


def _containerd_up(node: RealNode, containerd: process.Component) -> bool:
    if not process.alive(containerd.pid):
        raise GiveUp(f"containerd exited:\n{process.tail(containerd.log)}")
    return node.socket.exists() and node.ctr("version").returncode == 0


def join(api: KubeApi, kubelet: process.Component) -> None:
    """Wait for the node to register Ready, then lift the not-ready taint (the local control
    plane runs no node-lifecycle controller, which would)."""

    def ready() -> bool:
        if not process.alive(kubelet.pid):
            raise GiveUp(f"The real node's kubelet exited:\n{process.tail(kubelet.log)}")
        with contextlib.suppress(Exception):
            node = api.get(f"/api/v1/nodes/{NAME}")
            conditions = node.get("status", {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return False

    wait_for(ready, 60, f"node {NAME} Ready")
    node = api.get(f"/api/v1/nodes/{NAME}")
    taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != NOT_READY_TAINT]
    api.patch(f"/api/v1/nodes/{NAME}", {"spec": {"taints": taints or None}}, MERGE)


def stop(root: Path, slot: int, pids: dict[str, int]) -> None:
    """Stop the kubelet, kill every container (their shims outlive containerd), stop
    containerd, unmount what the node mounted under ``root`` and remove its cgroups."""
    if "real-kubelet" in pids:
        process.stop(pids["real-kubelet"], grace=10.0)
    node = RealNode(root)
    if "containerd" in pids and process.alive(pids["containerd"]):
        tasks = node.ctr("tasks", "ls", "-q").stdout.split()
        for task in tasks:
            node.ctr("tasks", "kill", "--signal", "SIGKILL", task)
        deadline = time.monotonic() + 10
        while tasks and time.monotonic() < deadline:
            tasks = [t for t in tasks if node.ctr("tasks", "delete", t).returncode != 0]
            time.sleep(0.2)
        for container in node.ctr("containers", "ls", "-q").stdout.split():
            node.ctr("containers", "delete", container)
    if "containerd" in pids:
        process.stop(pids["containerd"], grace=10.0)
    unmount_under(root)
    _remove_cgroup_root(slot)
    _remove_content(root / "containerd" / "root")


def _remove_content(store: Path) -> None:
    """The node's images and snapshots (about 13 GB with the engine image unpacked; pytest keeps
    its last three runs' folders), unless something is still mounted below them: removing
    through a mount would reach what it mounts (a pod's host-path volume)."""
    if not store.exists() or _mounts_under(store):
        return
    shutil.rmtree(store, ignore_errors=True)


def unmount_under(root: Path) -> None:
    """Lazily unmount every mount point below ``root``, deepest first (pod volumes, rootfs
    overlays, network namespaces), so the folder can be removed."""
    for point in sorted(set(_mounts_under(root)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    return [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(prefix)
    ]
