"""The local cluster's NetworkPolicy enforcer: watches NetworkPolicies, Pods and Namespaces and,
after each change, rewrites the cluster's iptables chains (``network_policy.py`` says what they
hold, ``firewall.py`` where they hang) in one ``iptables-restore`` transaction.

Ingress only, on pod-to-pod traffic across the cluster's bridge. Traffic from the node (the host
side of the bridge, 10.244.N.1: the tests, the in-process operator, the API server, probes,
Prometheus) goes out through the host's OUTPUT path, never the bridge's FORWARD path, so it is
always let in, as Calico and Cilium let a pod's own node in by default. Connections through a
ClusterIP are spliced by the userspace ``kube_proxy`` on the host, so their backends see them
come from the node too: a policy judges pod-to-pod connections by pod IP only.

Run as ``python -m kvscale_cluster.policy_controller``; the launcher starts it after the
kube-proxy, in the netns network only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from . import firewall, process
from .kube_api import Obj
from .kube_proxy import Watch, api_http
from .network_policy import ingress, main_chain, restore_input
from .service_table import Key
from .wait import GiveUp, wait_for

log = logging.getLogger("kvscale.policy_controller")
PATHS = {
    "policies": "/apis/networking.k8s.io/v1/networkpolicies",
    "pods": "/api/v1/pods",
    "namespaces": "/api/v1/namespaces",
}


def _cluster_key(obj: Obj) -> Key:
    return "", obj["metadata"]["name"]


async def run(kubeconfig: Path, slot: int, bridge: str) -> None:
    firewall.install(slot, bridge)
    http = api_http(kubeconfig)
    dirty = asyncio.Event()
    watches = {name: Watch(http, path, dirty.set) for name, path in PATHS.items()}
    watches["namespaces"].key = _cluster_key
    applied = ""

    async def resync() -> None:
        nonlocal applied
        while True:
            await dirty.wait()
            dirty.clear()
            if not all(w.synced for w in watches.values()):
                continue
            isolated = ingress(*(watches[n].store.values() for n in PATHS))
            text = restore_input(slot, isolated, await asyncio.to_thread(firewall.chains, slot))
            if text == applied:
                continue
            await asyncio.to_thread(firewall.restore, text)
            applied = text
            log.info("Applied rules for %d isolated pods", len(isolated))

    await asyncio.gather(resync(), *(w.run() for w in watches.values()))


def start_policy_controller(
    kubeconfig: Path, logs: Path, slot: int, bridge: str
) -> process.Component:
    """Start the enforcer (``wait_policy_controller`` waits for its chain)."""
    argv = [
        sys.executable,
        "-m",
        "kvscale_cluster.policy_controller",
        f"--kubeconfig={kubeconfig}",
        f"--slot={slot}",
        f"--bridge={bridge}",
    ]
    return process.start("network-policy", argv, logs)


def wait_policy_controller(component: process.Component, slot: int) -> None:
    """Wait until its first resync wrote the slot's chain."""

    def ready() -> bool:
        if not process.alive(component.pid):
            raise GiveUp(f"network-policy exited:\n{process.tail(component.log)}")
        return "Applied rules" in component.log.read_text()

    wait_for(ready, 30, f"the NetworkPolicy enforcer's first sync of {main_chain(slot)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvscale_cluster.policy_controller")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--bridge", required=True, help="the cluster's bridge (kvsbrN)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(run(args.kubeconfig, args.slot, args.bridge))


if __name__ == "__main__":
    main()
