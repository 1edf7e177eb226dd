"""``make demo`` (``python -m kvscale_demo``): the closed loop on the local cluster, watched live.

The local cluster comes up, kvscale is installed from manifests/ with kubectl exactly as a
platform team would on a real cluster (the operator runs as a pod under its own least-privilege
ServiceAccount), and the sample endpoint `manifests/samples/tiny-autoscaling.yaml` serves. Then
`kvscale loadtest` sends a short load pattern through the endpoint's Service (its router), one
run per phase: steady, rise, a 4x burst, quiet. A live terminal view shows what the operator
decides and what the fleet does; the run ends with a PNG timeline and the command to open it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.table import Table

from kvscale_cluster.__main__ import up
from kvscale_cluster.cluster import Cluster
from kvscale_cluster.config import default_cluster_dir
from kvscale_cluster.install import ROOT, install_kvscale
from kvscale_cluster.wait import wait_for

from .timeline import plot, write_json
from .view import Frame, render
from .watch import Sample, Watcher

SAMPLE = ROOT / "manifests" / "samples" / "tiny-autoscaling.yaml"
NAMESPACE = "demo"
SAMPLE_EVERY_S = 2.0
SETTLE_S = 120.0  # after the last phase: how long to wait for the replicas to come back down
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # requests per second
    seconds: float


PHASES = (
    Phase("steady", 0.5, 30),
    Phase("rise", 1.5, 40),
    Phase("burst", 6.0, 90),  # 4x the rise, in one step
    Phase("quiet", 0.2, 120),
)


def kubectl(cluster: Cluster, *args: str, show: bool = True, stdin: str | None = None) -> str:
    cmd = [str(BIN / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    if show:
        print(f"\n$ kubectl {' '.join(args)}", flush=True)
    done = subprocess.run([*cmd, *args], input=stdin, capture_output=True, text=True, timeout=660)
    if show and done.stdout.strip():
        print(done.stdout.rstrip(), flush=True)
    if done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        print(cluster.logs(20), file=sys.stderr)
        raise SystemExit(f"kubectl {' '.join(args)} failed")
    return done.stdout


def _deploy(cluster: Cluster, name: str) -> str:
    """Install kvscale, (re)create the sample endpoint, wait until it serves; its Service URL."""
    install_kvscale(lambda *args: kubectl(cluster, *args))
    namespace = f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=namespace, show=False)
    # a fresh endpoint each run, so the story starts at one replica
    kubectl(cluster, "-n", NAMESPACE, "delete", "llme", name, "--ignore-not-found", "--wait")
    kubectl(cluster, "apply", "--server-side", "-n", NAMESPACE, "-f", str(SAMPLE))
    wait = ("wait", f"llme/{name}", "--for=condition=Available", "--timeout=600s")
    kubectl(cluster, "-n", NAMESPACE, *wait)
    kubectl(cluster, "-n", NAMESPACE, "get", "llme,deployments,services,pods", "-o", "wide")
    service = json.loads(kubectl(cluster, "-n", NAMESPACE, "get", "svc", name, "-o", "json",
                                 show=False))  # fmt: skip
    return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def _first_completion(url: str, model: str) -> None:
    import httpx
    import openai

    def answering() -> bool:
        try:
            return httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answering, 180, f"the router at {url}")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=2)
    reply = client.completions.create(model=model, prompt="Hello!", max_tokens=16)
    print(f"\nA completion through the Service {url} (random weights, so the words are noise):")
    print(f"  {reply.choices[0].text!r}  usage={reply.usage}", flush=True)


def _loadtest(url: str, phase: Phase, index: int, out: Path, slo: str) -> subprocess.Popen[str]:
    argv = [
        str(BIN / "kvscale"), "loadtest", "--base-url", url, "--metrics-url", "none",
        "--dataset", "random", "--input-len", "32", "--output-len", "32",
        "--arrival", "poisson", "--request-rate", f"{phase.rate:g}",
        "--num-prompts", str(max(1, round(phase.rate * phase.seconds))),
        "--slo", slo, "--seed", str(index), "--no-plots", "--no-progress",
        "--request-timeout", "120", "--output-dir", str(out), "--label", phase.name,
        "--result-filename", f"{index}-{phase.name}.json",
    ]  # fmt: skip
    with (out / f"{index}-{phase.name}.log").open("w") as log:  # the child keeps its own copy
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)


def _drive(
    console: Console, watcher: Watcher, url: str, spec: dict[str, Any], out: Path
) -> tuple[list[Sample], list[subprocess.Popen[str]]]:
    """Run the phases on schedule while sampling the endpoint into the live view."""
    slo_ttft = float(spec["slo"]["ttftP99Seconds"])
    slo = f"ttft={slo_ttft}s,itl={spec['slo']['itlP99Seconds']}s"
    minimum = int(spec["scaling"].get("minReplicas", 1))
    starts, t = [], 0.0
    for phase in PHASES:
        starts.append(t)
        t += phase.seconds
    end = t
    samples: list[Sample] = []
    runs: list[subprocess.Popen[str]] = []
    decisions_seen = len(watcher.status().get("decisions") or [])
    began = time.monotonic()
    frame = Frame(watcher.name, slo_ttft, int(spec["scaling"]["maxReplicas"]), "", 0.0, 0.0)
    with Live(render(frame, samples), console=console, refresh_per_second=2) as live:
        while True:
            now = time.monotonic() - began
            while len(runs) < len(PHASES) and now >= starts[len(runs)]:
                phase = PHASES[len(runs)]
                console.log(f"Phase [bold]{phase.name}[/]: {phase.rate:g} req/s for "
                            f"{phase.seconds:g} s (kvscale loadtest → {url})")  # fmt: skip
                runs.append(_loadtest(url, phase, len(runs), out, slo))
            index = max(len(runs) - 1, 0)
            phase = PHASES[index] if now < end else Phase("settle", 0.0, SETTLE_S)
            left = (starts[index] + phase.seconds if now < end else end + SETTLE_S) - now
            try:
                status = watcher.status()
                sample = watcher.sample(now, phase.name, phase.rate, status)
            except Exception as err:  # a slow or restarting API server: try again next time
                console.log(f"Could not read {watcher.name}: {err}")
                time.sleep(SAMPLE_EVERY_S)
                continue
            samples.append(sample)
            for d in (status.get("decisions") or [])[decisions_seen:]:
                console.log(f"Scaled {d['fromReplicas']} → {d['toReplicas']}: "
                            f"[cyan]{d['reason']}[/] {d.get('message', '')}")  # fmt: skip
            decisions_seen = len(status.get("decisions") or [])
            live.update(render(Frame(watcher.name, slo_ttft, frame.max_replicas, phase.name,
                                     left, phase.rate), samples))  # fmt: skip
            done = all(run.poll() is not None for run in runs) and len(runs) == len(PHASES)
            back = sample.desired == minimum and sample.ready == minimum
            if now >= end and done and (back or now >= end + SETTLE_S):
                break
            time.sleep(max(0.0, SAMPLE_EVERY_S - (time.monotonic() - began - now)))
    return samples, runs


def _results_table(out: Path) -> Table:
    table = Table(title="kvscale loadtest, one run per phase (through the endpoint's Service)")
    for column in ("phase", "req/s", "completed", "failed", "p50 TTFT", "p99 TTFT", "within SLO"):
        table.add_column(column, justify="right" if column != "phase" else "left")
    for i, phase in enumerate(PHASES):
        path = out / f"{i}-{phase.name}.json"
        if not path.exists():
            table.add_row(phase.name, f"{phase.rate:g}", "-", "-", "-", "-", "no report")
            continue
        r = json.loads(path.read_text())
        attained = r.get("slo_attainment")
        table.add_row(
            phase.name,
            f"{phase.rate:g}",
            str(r["completed"]),
            str(r["failed"]),
            f"{r.get('median_ttft_ms', 0) / 1000:.2f} s",
            f"{r.get('p99_ttft_ms', 0) / 1000:.2f} s",
            "-" if attained is None else f"{100 * attained:.0f} %",
        )
    return table


def _decisions_table(status: dict[str, Any]) -> Table:
    table = Table(title="status.decisions: every change of the replica count, with its reason")
    for column in ("time", "from", "to", "reason", "message"):
        table.add_column(column)
    for d in status.get("decisions") or []:
        table.add_row(d["time"], str(d["fromReplicas"]), str(d["toReplicas"]), d["reason"],
                      d.get("message", ""))  # fmt: skip
    return table


def main() -> int:
    began = time.monotonic()
    console = Console()
    directory = default_cluster_dir().resolve()
    up(directory)
    cluster = Cluster.attach(directory)
    sample = yaml.safe_load(SAMPLE.read_text())
    name, model = sample["metadata"]["name"], sample["spec"]["model"]["name"]
    url = _deploy(cluster, name)
    _first_completion(url, model)
    out = directory.parent / "demo"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    watcher = Watcher(cluster.api_client(), cluster.prometheus_url, NAMESPACE, name)
    try:
        spec = watcher.spec()
        samples, runs = _drive(console, watcher, url, spec, out)
        for run in runs:
            run.wait(timeout=300)
        status = watcher.status()
    finally:
        watcher.close()
    console.print(_results_table(out))
    console.print(_decisions_table(status))
    write_json(samples, out / "timeline.json")
    title = f"kvscale demo: LLMEndpoint {NAMESPACE}/{name} under steady, rise, burst, quiet"
    png = plot(samples, float(spec["slo"]["ttftP99Seconds"]), title, out / "timeline.png")
    opener = "open" if sys.platform == "darwin" else "xdg-open"
    console.print(
        f"\nDemo finished in {time.monotonic() - began:.0f} s. The timeline of the run:"
        f"\n  {opener} {png}"
        f"\nEach phase's loadtest report: {out}/<n>-<phase>.json; the samples: {out}/timeline.json"
        f"\nThe cluster keeps running: export KUBECONFIG={cluster.kubeconfig}; "
        f"{os.path.relpath(BIN / 'kubectl')} -n {NAMESPACE} describe llme {name}"
        "\n`make cluster-down` stops it."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
