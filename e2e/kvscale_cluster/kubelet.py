"""The process kubelet: registers Nodes (with ``nvidia.com/gpu`` capacity), keeps them Ready and
their Leases fresh, and runs every pod bound to them as local processes (one ``PodWorker`` per pod).

Run as ``python -m kvscale_cluster.kubelet``; the launcher starts it in its own process group.
SIGTERM stops every pod's processes (their pods stay in the API) and removes their namespaces.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from .config import NodeConfig, nodes_from_json
from .cpu_quota import CpuQuotas
from .kube_api import MERGE, ApiError, KubeApi, Obj
from .log_server import start_log_server
from .netns import make_network
from .nodes import lease_object, node_object, node_status, now_iso, now_micro
from .pod_worker import PodContext, PodWorker
from .ports import free_port

log = logging.getLogger("kvscale.kubelet")
HEARTBEAT_SECONDS = 10.0
SYNC_SECONDS = 0.5
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


class Kubelet:
    """Publishes the nodes and keeps one worker per pod bound to them."""

    def __init__(
        self,
        api: KubeApi,
        nodes: tuple[NodeConfig, ...],
        ctx: PodContext,
        port: int,
        nodes_file: Path | None = None,
    ) -> None:
        self.api = api
        self.port = port
        self.nodes = nodes
        self.nodes_file = nodes_file  # re-read every sync: nodes join and leave at run time
        self.ctx = ctx
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()  # pods whose worker ended (deletion confirmed)
        self.started = now_iso()
        self.node_uids: dict[str, str] = {}
        self.stopping = threading.Event()

    def register(self) -> None:
        """Create (or adopt) each Node, publish its status and drop not-ready taints.

        The API server's TaintNodesByCondition admission taints new nodes not-ready; the
        node-lifecycle controller would lift it once the node is Ready, but we keep the node Ready
        ourselves and lift it here, so pods are never stranded.
        """
        for node in self.nodes:
            self._register(node)

    def _register(self, node: NodeConfig) -> None:
        try:
            created = self.api.post("/api/v1/nodes", node_object(node))
        except ApiError as error:
            if error.status != 409:
                raise
            created = self.api.get(f"/api/v1/nodes/{node.name}")
        self.node_uids[node.name] = created["metadata"]["uid"]
        self._heartbeat(node)
        taints = [
            t for t in created["spec"].get("taints") or [] if t.get("key") not in NOT_READY_TAINTS
        ]
        self.api.patch(f"/api/v1/nodes/{node.name}", {"spec": {"taints": taints or None}}, MERGE)
        log.info("Registered node %s with %d GPUs", node.name, node.gpus)

    def _heartbeat(self, node: NodeConfig) -> None:
        status = node_status(node, self.ctx.network.host_ip, self.started, self.port)
        self.api.patch(f"/api/v1/nodes/{node.name}/status", {"status": status}, MERGE)
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node.name}"
        try:
            lease = self.api.get(path)
        except ApiError as error:
            if error.status != 404:
                raise
            self.api.post(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                lease_object(node, self.node_uids[node.name]),
            )
            return
        lease["spec"]["renewTime"] = now_micro()
        self.api.put(path, lease)

    def _bound_pods(self) -> dict[str, Obj]:
        pods: dict[str, Obj] = {}
        for node in self.nodes:
            listed = self.api.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node.name}"})
            for pod in listed["items"]:
                pods[pod["metadata"]["uid"]] = pod
        return pods

    def sync(self) -> None:
        """One level-triggered pass: start workers for new pods, feed the rest their latest."""
        pods = self._bound_pods()
        self.finished &= set(pods)
        for uid, pod in pods.items():
            if uid in self.finished:
                continue
            worker = self.workers.get(uid)
            if worker is None:
                worker = PodWorker(self.ctx, pod)
                self.workers[uid] = worker
                worker.start()
            else:
                worker.update(pod)
        for uid, worker in list(self.workers.items()):
            if uid not in pods:
                worker.vanish()
            if not worker.is_alive():
                del self.workers[uid]
                self.finished.add(uid)

    def follow_nodes_file(self) -> None:
        """Register nodes added to the nodes file and delete the Nodes removed from it."""
        if self.nodes_file is None or not self.nodes_file.exists():
            return
        wanted = nodes_from_json(self.nodes_file.read_text())
        known = {n.name for n in self.nodes}
        for node in wanted:
            if node.name not in known:
                self._register(node)
        for node in self.nodes:
            if node.name not in {n.name for n in wanted}:
                try:
                    self.api.delete(f"/api/v1/nodes/{node.name}")
                except ApiError as error:
                    if error.status != 404:
                        raise
                log.info("Removed node %s", node.name)
        self.nodes = wanted

    def run(self) -> None:
        self.register()
        next_beat = time.monotonic() + HEARTBEAT_SECONDS
        while not self.stopping.is_set():
            try:
                self.follow_nodes_file()
                self.sync()
                if time.monotonic() >= next_beat:
                    for node in self.nodes:
                        self._heartbeat(node)
                    next_beat = time.monotonic() + HEARTBEAT_SECONDS
            except Exception:
                log.exception("Kubelet sync failed; retrying")
            self.stopping.wait(SYNC_SECONDS)
        self.shutdown()

    def shutdown(self) -> None:
        """Stop every pod's processes and free their namespaces."""
        for worker in self.workers.values():
            worker.shutdown()
        for worker in self.workers.values():
            worker.join(timeout=15)
        if self.ctx.cpu_quotas is not None:
            self.ctx.cpu_quotas.close()
        log.info("Kubelet stopped %d pods", len(self.workers))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvscale_cluster.kubelet")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--network", choices=("netns", "loopback"), required=True)
    parser.add_argument("--nodes", required=True, help="JSON list of NodeConfig fields")
    parser.add_argument(
        "--nodes-file", type=Path, default=None, help="the same list in a file, followed live"
    )
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--pod-logs", type=Path, required=True)
    parser.add_argument("--tls-cert", type=Path, required=True, help="for the log endpoint")
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument(
        "--cpu-cfs-quota",
        action="store_true",
        help="enforce containers' CPU limits with CFS quotas (cgroup v1 cpu controller)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    api = KubeApi.from_kubeconfig(args.kubeconfig)
    ctx = PodContext(
        api=api,
        network=make_network(args.slot, args.network),
        network_lock=threading.Lock(),
        state_dir=args.state_dir,
        pod_logs=args.pod_logs,
        cpu_quotas=CpuQuotas.for_slot(args.slot) if args.cpu_cfs_quota else None,
    )
    host = ctx.network.host_ip
    port = free_port(host)
    start_log_server(host, port, args.tls_cert, args.tls_key, args.pod_logs)
    kubelet = Kubelet(api, nodes_from_json(args.nodes), ctx, port, args.nodes_file)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("Kubelet got signal %d; stopping", signum)
        kubelet.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kubelet.run()
    sys.exit(0)


if __name__ == "__main__":
    main()
