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
from .install import ROOT, install_kvscale

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


def _serve(cluster: Cluster) -> None:
    """A completion through the official client, then a short load test, on a replica."""
    import openai

    ip = kubectl(
        cluster,
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "kvscale.io/endpoint=tiny",
        "-o",
        "jsonpath={.items[0].status.podIP}",
        show=False,
    )
    base = f"http://{ip}:8000"
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    reply = client.completions.create(model="tiny-llama", prompt="Hello!", max_tokens=16)
    print(f"\nA completion from {base} (random weights, so the words are noise):")
    print(f"  {reply.choices[0].text!r}  usage={reply.usage}")
    print(f"\n$ kvscale loadtest --base-url {base} --num-prompts 40 --request-rate 8 ...")
    subprocess.run(
        [
            str(Path(sys.executable).parent / "kvscale"),
            "loadtest",
            "--base-url",
            base,
            "--num-prompts",
            "40",
            "--request-rate",
            "8",
            "--input-len",
            "64",
            "--output-len",
            "32",
            "--no-plots",
            "--no-progress",
            "--output-dir",
            str(cluster.directory / "loadtest"),
        ],
        check=True,
        timeout=300,
    )


def main() -> int:
    directory = default_cluster_dir().resolve()
    up(directory)
    cluster = Cluster.attach(directory)
    install_kvscale(lambda *args: kubectl(cluster, *args))
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
    _serve(cluster)
    print(
        f"\nThe cluster keeps running. export KUBECONFIG={cluster.kubeconfig} to look around;"
        "\n`make cluster-down` stops it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
