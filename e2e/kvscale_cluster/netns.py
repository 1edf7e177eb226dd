"""Pod networking: one Linux bridge per cluster and one network namespace (veth pair) per pod.

Each cluster holds a *slot* N in 1..250 and owns subnet 10.244.N.0/24: the bridge ``kvsbrN`` has
10.244.N.1 (the host side, where the API server and Prometheus also listen so pods reach them) and
pods get 10.244.N.2-191 (.192-.254 are the real node's, ``real_node.py``). The cluster's Service
range 10.96.N.0/24 is routed as local on the bridge, so the host owns every ClusterIP
(``kube_proxy.py`` listens there), and each pod's namespace gets a ``resolv.conf`` naming the
cluster DNS on 10.244.N.1 (``ip netns exec`` bind-mounts ``/etc/netns/<namespace>/resolv.conf``
over ``/etc/resolv.conf``). Nothing is routed off the
machine: there is no NAT and no default route beyond the bridge. A slot's registry file lists
the PIDs of the cluster that holds it; a slot whose PIDs are all dead belongs to a crashed run,
and its namespaces, veths and bridge are removed before it is reused. Where namespaces cannot be
made, ``LoopbackNetwork`` hands out distinct 127.244.N.x addresses instead (EndpointSlices refuse
those, so Services do not work there).
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import firewall
from .process import alive

REGISTRY = Path(os.environ.get("KVSCALE_NET_REGISTRY", "/run/kvscale/slots"))
NETNS_ETC = Path("/etc/netns")
SLOTS = range(1, 251)
POD_INDEXES = range(2, 192)  # .192-.254 are the real node's (real_node.py, host-local)


class NetworkError(RuntimeError):
    """An ``ip`` command failed."""


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip`` with ``args``; raise ``NetworkError`` with its stderr when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def bridge_name(slot: int) -> str:
    return f"kvsbr{slot}"


def service_cidr(slot: int) -> str:
    """The slot's Service (ClusterIP) range; its first address is the ``kubernetes`` Service's."""
    return f"10.96.{slot}.0/24"


def netns_name(slot: int, index: int) -> str:
    return f"kvs{slot}-{index}"


def veth_name(slot: int, index: int) -> str:
    return f"kvs{slot}v{index}"


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with (REGISTRY / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _slot_record(slot: int) -> dict[str, Any]:
    try:
        record: dict[str, Any] = json.loads((REGISTRY / str(slot)).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return record


def _netns_names() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list", check=False).splitlines() if line]


def _link_names() -> list[str]:
    return [
        line.split(":")[1].strip().split("@")[0]
        for line in ip("-o", "link", "show", check=False).splitlines()
        if ":" in line
    ]


def delete_netns(name: str) -> None:
    """Kill every process in namespace ``name`` and delete it (its veth goes with it)."""
    for pid in ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", name, check=False)
    shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def clean_slot(slot: int) -> None:
    """Remove every namespace, veth, the bridge and the iptables chains of ``slot``."""
    names = set(_netns_names())
    if NETNS_ETC.is_dir():
        names |= {p.name for p in NETNS_ETC.iterdir()}
    for name in names:
        if name.startswith(f"kvs{slot}-"):
            delete_netns(name)
    for link in _link_names():
        if link.startswith(f"kvs{slot}v") or link == bridge_name(slot):
            ip("link", "del", link, check=False)
    firewall.remove(slot, bridge_name(slot))


def claim_slot(owner: str, pids: Sequence[int]) -> int:
    """Claim a free slot for cluster ``owner`` (its folder) whose liveness is ``pids``;
    clean a stale one first."""
    with _registry_lock():
        links = _link_names()
        for slot in SLOTS:
            held = _slot_record(slot)
            if any(alive(pid) for pid in held.get("pids", [])):
                continue
            if held or bridge_name(slot) in links:
                clean_slot(slot)  # left behind by a crashed run
            record_slot(slot, owner, pids)
            return slot
    raise NetworkError("No free pod-network slot (250 clusters running?)")


def record_slot(slot: int, owner: str, pids: Sequence[int]) -> None:
    """Set the PIDs whose liveness keeps ``slot`` held by ``owner``."""
    REGISTRY.mkdir(parents=True, exist_ok=True)
    (REGISTRY / str(slot)).write_text(json.dumps({"owner": owner, "pids": list(pids)}))


def release_slot(slot: int, owner: str) -> None:
    """Clean ``slot`` and drop its registry entry, unless another cluster has claimed it since
    (a ``down`` long after a crash must not tear down the slot's new holder)."""
    with _registry_lock():
        if _slot_record(slot).get("owner", owner) != owner:
            return
        clean_slot(slot)
        (REGISTRY / str(slot)).unlink(missing_ok=True)


@dataclass(frozen=True)
class PodAddress:
    """Where a pod's processes run: their IP and the namespace to enter (None: the host's)."""

    ip: str
    netns: str | None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside the pod's namespace."""
        if self.netns is None:
            return list(argv)
        return ["ip", "netns", "exec", self.netns, *argv]


class PodNetwork(abc.ABC):
    """Hands out pod addresses inside a slot; ``NetnsNetwork`` and ``LoopbackNetwork`` differ in
    whether each pod gets its own namespace. Callers serialise ``attach``/``detach``."""

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self._used: set[int] = set()

    @property
    @abc.abstractmethod
    def host_ip(self) -> str:
        """The host's address as pods see it."""

    def _next_index(self) -> int:
        index = next(i for i in POD_INDEXES if i not in self._used)
        self._used.add(index)
        return index

    @abc.abstractmethod
    def attach(self, namespace: str = "default") -> PodAddress:
        """A new address (and network namespace) for a pod of Kubernetes ``namespace``."""

    @abc.abstractmethod
    def detach(self, address: PodAddress) -> None:
        """Free ``address`` and its namespace (killing what still runs there)."""


class NetnsNetwork(PodNetwork):
    """A namespace and veth per pod on the slot's bridge."""

    @property
    def host_ip(self) -> str:
        return f"10.244.{self.slot}.1"

    def create_bridge(self) -> None:
        br = bridge_name(self.slot)
        ip("link", "add", br, "type", "bridge")
        ip("addr", "add", f"{self.host_ip}/24", "dev", br)
        ip("link", "set", br, "up")
        ip("route", "add", "local", service_cidr(self.slot), "dev", br)

    def attach(self, namespace: str = "default") -> PodAddress:
        index = self._next_index()
        ns, veth = netns_name(self.slot, index), veth_name(self.slot, index)
        pod_ip = f"10.244.{self.slot}.{index}"
        delete_netns(ns)
        ip("link", "del", veth, check=False)
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", bridge_name(self.slot), "up")
        ip("-n", ns, "addr", "add", f"{pod_ip}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "route", "add", "default", "via", self.host_ip)
        etc = NETNS_ETC / ns
        etc.mkdir(parents=True, exist_ok=True)
        search = f"{namespace}.svc.cluster.local svc.cluster.local cluster.local"
        (etc / "resolv.conf").write_text(
            f"nameserver {self.host_ip}\nsearch {search}\noptions ndots:5\n"
        )
        return PodAddress(ip=pod_ip, netns=ns)

    def detach(self, address: PodAddress) -> None:
        if address.netns is not None:
            delete_netns(address.netns)
        self._used.discard(int(address.ip.rsplit(".", 1)[1]))


class LoopbackNetwork(PodNetwork):
    """Fallback without namespaces: a distinct 127.244.N.x address per pod, no isolation."""

    @property
    def host_ip(self) -> str:
        return "127.0.0.1"

    def attach(self, namespace: str = "default") -> PodAddress:
        return PodAddress(ip=f"127.244.{self.slot}.{self._next_index()}", netns=None)

    def detach(self, address: PodAddress) -> None:
        self._used.discard(int(address.ip.rsplit(".", 1)[1]))


def netns_supported() -> bool:
    """Whether this process may create network namespaces and bridges (root with CAP_NET_ADMIN)."""
    if os.geteuid() != 0:
        return False
    probe = "kvsprobe"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    if ok.returncode != 0:
        return False
    ip("netns", "del", probe, check=False)
    return True


def make_network(slot: int, mode: str) -> PodNetwork:
    """The network for ``mode`` ("netns" or "loopback")."""
    return NetnsNetwork(slot) if mode == "netns" else LoopbackNetwork(slot)
