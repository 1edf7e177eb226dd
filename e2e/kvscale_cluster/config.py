"""What a local cluster looks like: its nodes (with GPU counts), its network mode, its folder."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

NETWORK_MODES = ("auto", "netns", "loopback")


@dataclass(frozen=True)
class NodeConfig:
    """A Node the process kubelet registers; ``gpus`` becomes ``nvidia.com/gpu`` capacity."""

    name: str
    gpus: int = 2
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"Node {self.name}: gpus must be >= 0, got {self.gpus}")


def default_nodes() -> tuple[NodeConfig, ...]:
    return (NodeConfig("kvscale-node-1"), NodeConfig("kvscale-node-2"))


@dataclass(frozen=True)
class ClusterConfig:
    """A cluster's shape. ``network``: "netns" (a namespace per pod), "loopback" (127.x
    addresses) or "auto" (netns where the process may create namespaces)."""

    nodes: tuple[NodeConfig, ...] = field(default_factory=default_nodes)
    network: str = "auto"
    prometheus: bool = True
    real_node: bool = False  # a third node under the upstream kubelet (real_node.py)
    # containers' CPU limits enforced as CFS quotas (cpu_quota.py), as the kubelet's
    # --cpu-cfs-quota does; off by default here, where two cores run the whole cluster
    cpu_cfs_quota: bool = False
    # images the real node's containerd copies from Docker's engine when it starts (`docker save
    # | ctr images import -`, no tarball on disk): what the image tarballs do not hold
    docker_images: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.network not in NETWORK_MODES:
            raise ValueError(f"network must be one of {NETWORK_MODES}, got {self.network!r}")
        if not self.nodes:
            raise ValueError("A cluster needs at least one node")

    @classmethod
    def from_env(cls) -> ClusterConfig:
        """Defaults, overridden by ``KVSCALE_CLUSTER_NODES`` ("name:gpus,name:gpus") and
        ``KVSCALE_POD_NETWORK``; ``KVSCALE_REAL_NODE=1`` adds the real node and
        ``KVSCALE_CPU_CFS_QUOTA=1`` enforces CPU limits."""
        spec = os.environ.get("KVSCALE_CLUSTER_NODES", "")
        nodes = default_nodes()
        if spec:
            nodes = tuple(
                NodeConfig(name=item.split(":")[0], gpus=int(item.split(":")[1] or 0))
                for item in spec.split(",")
            )
        return cls(
            nodes=nodes,
            network=os.environ.get("KVSCALE_POD_NETWORK", "auto"),
            real_node=os.environ.get("KVSCALE_REAL_NODE") == "1",
            cpu_cfs_quota=os.environ.get("KVSCALE_CPU_CFS_QUOTA") == "1",
        )


def nodes_to_json(nodes: tuple[NodeConfig, ...]) -> str:
    return json.dumps([asdict(n) for n in nodes])


def nodes_from_json(text: str) -> tuple[NodeConfig, ...]:
    return tuple(NodeConfig(**item) for item in json.loads(text))


def default_cluster_dir() -> Path:
    """Where ``python -m kvscale_cluster up`` keeps its cluster: ``$KVSCALE_CLUSTER_DIR`` or
    ``.kvscale/cluster`` under the current directory."""
    return Path(os.environ.get("KVSCALE_CLUSTER_DIR", ".kvscale/cluster")).resolve()
