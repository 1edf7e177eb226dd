"""The local cluster: starts every component in order, records them in ``state.json`` and stops
them by PID, so ``python -m kvscale_cluster down`` can stop a cluster another process started."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import control_plane, netns, process, real_node
from .binaries import k8s_bin_dir
from .config import ClusterConfig, NodeConfig, nodes_from_json, nodes_to_json
from .cpu_quota import CpuQuotas
from .kube_api import KubeApi
from .kube_proxy import start_kube_proxy, wait_kube_proxy
from .kubeconfig import write_kubeconfig
from .pki import ADMIN_USER, Pki, create_pki
from .policy_controller import start_policy_controller, wait_policy_controller
from .prometheus import start_prometheus
from .wait import GiveUp, wait_for

STOP_ORDER = (
    "kubelet",
    "network-policy",
    "kube-proxy",
    "prometheus",
    "pod-discovery",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)


@dataclass
class ClusterState:
    """What ``down`` and other processes need to find and stop a running cluster."""

    directory: str
    kubeconfig: str
    api_url: str
    ca_path: str
    token: str
    host_ip: str
    network: str
    slot: int
    prometheus_url: str | None = None
    service_cidr: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    start_seconds: float = 0.0

    @classmethod
    def load(cls, directory: Path) -> ClusterState:
        return cls(**json.loads((directory / "state.json").read_text()))

    def save(self) -> None:
        (Path(self.directory) / "state.json").write_text(json.dumps(asdict(self), indent=2))


class Cluster:
    """A running local cluster. Create with ``Cluster.start(directory, config)``."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    # -- what tests and people use
    @property
    def directory(self) -> Path:
        return Path(self.state.directory)

    @property
    def kubeconfig(self) -> Path:
        return Path(self.state.kubeconfig)

    @property
    def api_url(self) -> str:
        return self.state.api_url

    @property
    def ca_path(self) -> Path:
        return Path(self.state.ca_path)

    @property
    def token(self) -> str:
        return self.state.token

    @property
    def host_ip(self) -> str:
        """The address pods reach the host on (API server and Prometheus listen there)."""
        return self.state.host_ip

    @property
    def prometheus_url(self) -> str:
        if self.state.prometheus_url is None:
            raise RuntimeError("This cluster was started without Prometheus")
        return self.state.prometheus_url

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def pod_logs_dir(self) -> Path:
        return self.logs_dir / "pods"

    def api_client(self) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` authenticated as the admin."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.api_url
        configuration.ssl_ca_cert = str(self.ca_path)
        configuration.api_key = {"authorization": f"Bearer {self.token}"}
        return client.ApiClient(configuration)

    def logs(self, lines: int = 40) -> str:
        """The tails of every component's and every pod's log, for failure reports."""
        paths = sorted(self.logs_dir.glob("*.log")) + sorted(self.pod_logs_dir.glob("*.log"))
        return "\n".join(f"==> {p} <==\n{process.tail(p, lines)}\n" for p in paths)

    def alive(self) -> dict[str, bool]:
        return {name: process.alive(pid) for name, pid in self.state.pids.items()}

    # -- nodes join and leave while the cluster runs (the kubelet follows its nodes file)
    @property
    def nodes_file(self) -> Path:
        return self.directory / "nodes.json"

    def nodes(self) -> tuple[NodeConfig, ...]:
        return nodes_from_json(self.nodes_file.read_text())

    def _nodes_file(self, nodes: tuple[NodeConfig, ...]) -> Path:
        staged = self.nodes_file.with_suffix(".tmp")
        staged.write_text(nodes_to_json(nodes))
        staged.replace(self.nodes_file)
        return self.nodes_file

    def add_node(self, node: NodeConfig) -> None:
        """A node joins: the kubelet registers it within a sync, Ready and untainted."""
        self._nodes_file((*self.nodes(), node))

    def remove_node(self, name: str) -> None:
        """A node leaves: the kubelet deletes its Node object."""
        self._nodes_file(tuple(n for n in self.nodes() if n.name != name))

    # -- life cycle
    @classmethod
    def start(cls, directory: Path, config: ClusterConfig | None = None) -> Cluster:
        """Start a fresh cluster in ``directory`` (wiped first); stop what started on failure."""
        config = config or ClusterConfig()
        began = time.monotonic()
        if directory.exists():
            shutil.rmtree(directory)
        (directory / "logs").mkdir(parents=True)
        mode = config.network
        if mode == "auto":
            mode = "netns" if netns.netns_supported() else "loopback"
        slot = netns.claim_slot(str(directory), [os.getpid()])
        network = netns.make_network(slot, mode)
        state = ClusterState(
            directory=str(directory),
            kubeconfig=str(directory / "kubeconfig"),
            api_url="",
            ca_path="",
            token="",
            host_ip=network.host_ip,
            network=mode,
            slot=slot,
            service_cidr=netns.service_cidr(slot),
        )
        cluster = cls(state)
        try:
            if isinstance(network, netns.NetnsNetwork):
                network.create_bridge()
            cluster._start_components(config, k8s_bin_dir())
        except BaseException:
            cluster.stop()
            raise
        state.start_seconds = round(time.monotonic() - began, 2)
        state.save()
        return cluster

    def _record(self, component: process.Component) -> None:
        self.state.pids[component.name] = component.pid
        netns.record_slot(
            self.state.slot, self.state.directory, [os.getpid(), *self.state.pids.values()]
        )
        self.state.save()

    def _start_components(self, config: ClusterConfig, bin_dir: Path) -> None:
        work, logs, host = self.directory, self.logs_dir, self.host_ip
        cidr = self.state.service_cidr
        kubernetes_ip = str(next(ipaddress.ip_network(cidr).hosts()))
        pki = create_pki(work / "pki", sorted({host, "127.0.0.1", kubernetes_ip}))
        ep = control_plane.allocate(host, cidr)
        self.state.api_url, self.state.ca_path = ep.api_url, str(pki.ca_cert)
        self.state.token = pki.admin_token
        write_kubeconfig(self.kubeconfig, ep.api_url, pki.ca_cert, pki.admin_token, ADMIN_USER)
        self._record(control_plane.start_etcd(bin_dir, work / "etcd", logs, ep))
        self._record(control_plane.start_apiserver(bin_dir, pki, work, logs, ep, host))
        kcm, scheduler = control_plane.start_controllers(
            bin_dir, pki, self.kubeconfig, work, logs, ep
        )
        self._record(kcm)
        self._record(scheduler)
        kubelet = process.start(
            "kubelet",
            [
                sys.executable,
                "-m",
                "kvscale_cluster.kubelet",
                f"--kubeconfig={self.kubeconfig}",
                f"--slot={self.state.slot}",
                f"--network={self.state.network}",
                f"--nodes={nodes_to_json(config.nodes)}",
                f"--nodes-file={self._nodes_file(config.nodes)}",
                f"--state-dir={work / 'kubelet'}",
                f"--pod-logs={self.pod_logs_dir}",
                f"--tls-cert={pki.serving_cert}",
                f"--tls-key={pki.serving_key}",
                *(["--cpu-cfs-quota"] if config.cpu_cfs_quota else []),
            ],
            logs,
        )
        self._record(kubelet)
        if self.state.network == "netns":  # Services route only where pods have real addresses
            proxy = start_kube_proxy(self.kubeconfig, logs, host)
            self._record(proxy)
            wait_kube_proxy(proxy, host)
            slot = self.state.slot
            policies = start_policy_controller(self.kubeconfig, logs, slot, netns.bridge_name(slot))
            self._record(policies)
            wait_policy_controller(policies, slot)
        if config.prometheus:
            started, self.state.prometheus_url = start_prometheus(
                self.kubeconfig, work / "prometheus", logs, host
            )
            for component in started:
                self._record(component)
        control_plane.wait_controllers(kcm, scheduler, ep)
        self._wait_nodes(config, kubelet)
        if config.real_node:
            self._start_real_node(pki, bin_dir, config.docker_images)

    def _start_real_node(self, pki: Pki, bin_dir: Path, docker_images: tuple[str, ...]) -> None:
        if self.state.network != "netns":
            raise real_node.RealNodeError("The real node needs the netns pod network (a bridge)")
        api = KubeApi(self.api_url, self.token, self.state.ca_path)
        real_node.grant_node_role(api)
        real_node.publish_api_endpoint(api, self.api_url)
        started = real_node.start(
            self.directory / "real-node",
            pki,
            self.api_url,
            self.host_ip,
            self.state.slot,
            bin_dir,
            self.logs_dir,
            docker_images,
        )
        for component in started:
            self._record(component)
        real_node.join(api, started[-1])
        api.close()

    def _wait_nodes(self, config: ClusterConfig, kubelet: process.Component) -> None:
        api = KubeApi(self.api_url, self.token, self.state.ca_path)
        wanted = {n.name for n in config.nodes}

        def ready() -> bool:
            if not process.alive(kubelet.pid):
                raise GiveUp(f"kubelet exited:\n{process.tail(kubelet.log)}")
            ok = {
                n["metadata"]["name"]
                for n in api.get("/api/v1/nodes")["items"]
                if not n["spec"].get("taints")
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions") or []
                )
            }
            return wanted <= ok

        wait_for(ready, 30, f"nodes {sorted(wanted)} Ready and untainted")
        # pods need their namespace's default service account to exist
        path = "/api/v1/namespaces/default/serviceaccounts/default"
        wait_for(lambda: api.get(path), 30, "service account default/default")
        api.close()

    def stop(self) -> None:
        """Stop every component by PID (kubelet first, so pods end gracefully) and clean up."""
        if any(name in self.state.pids for name in real_node.COMPONENTS):
            real_node.stop(self.directory / "real-node", self.state.slot, self.state.pids)
        for name in STOP_ORDER:
            pid = self.state.pids.get(name)
            if pid is not None:
                process.stop(pid, grace=20.0 if name == "kubelet" else 10.0)
        netns.release_slot(self.state.slot, self.state.directory)
        CpuQuotas.of_slot(self.state.slot).close(wait_s=5.0)  # a crashed kubelet's cgroups
        self.state.pids = {}
        if self.directory.exists():
            self.state.save()

    @classmethod
    def attach(cls, directory: Path) -> Cluster:
        """The cluster recorded in ``directory``'s state.json."""
        return cls(ClusterState.load(directory))
