"""``make demo``: the local cluster, kvscale installed from manifests/, and the sample endpoint.

Everything is applied with kubectl exactly as a platform team would on a real cluster; the
operator runs as a pod under its own least-privilege ServiceAccount.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .__main__ import up
from .cluster import Cluster
from .config import default_cluster_dir

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "manifests" / "samples" / "tiny-dummy.yaml"
NAMESPACE = "demo"


def kubectl(cluster: Cluster, *args: str, show: bool = True, stdin: str | None = None) -> str:
    cmd = [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    if show:
        print(f"\n$ kubectl {' '.join(args)}", flush=True)
    done = subprocess.run([*cmd, *args], input=stdin, capture_output=True, text=True, timeout=660)
    if show:
        print(done.stdout.rstrip(), flush=True)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        print(cluster.logs(20), file=sys.stderr)
        raise SystemExit(f"kubectl {' '.join(args)} failed")
    return done.stdout


def main() -> int:
    directory = default_cluster_dir().resolve()
    up(directory)
    cluster = Cluster.attach(directory)
    crd = ROOT / "e2e" / "crds" / "servicemonitors.monitoring.coreos.com.yaml"
    kubectl(cluster, "apply", "--server-side", "-f", str(crd))
    kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/servicemonitors.monitoring.coreos.com",
    )
    kubectl(cluster, "apply", "--server-side", "-k", str(ROOT / "manifests"))
    kubectl(
        cluster,
        "-n",
        "kvscale-system",
        "rollout",
        "status",
        "deployment/kvscale-operator",
        "--timeout=180s",
    )
    namespace = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=namespace)
    kubectl(cluster, "apply", "--server-side", "-n", NAMESPACE, "-f", str(SAMPLE))
    kubectl(
        cluster, "-n", NAMESPACE, "wait", "llme/tiny", "--for=condition=Available", "--timeout=600s"
    )
    kubectl(cluster, "get", "llme", "-A")
    kubectl(
        cluster, "-n", NAMESPACE, "get", "deployments,replicasets,services,pdb,pods", "-o", "wide"
    )
    kubectl(
        cluster,
        "-n",
        NAMESPACE,
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=LLMEndpoint",
    )
    print(
        f"\nThe cluster keeps running. export KUBECONFIG={cluster.kubeconfig} to look around;"
        "\n`make cluster-down` stops it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
