"""kvscale against KEDA + the HPA on the same local cluster, same engines, same load, same SLO.

A fresh local cluster (real API server, controller manager with its HPA controller, Prometheus,
the process kubelet) and KEDA v2 built from its Go module (`make keda`, e2e/keda/build.sh), its
metrics adapter registered through the aggregation layer. Run A: kvscale's `LLMEndpoint` (its
operator in this process). Then KEDA runs: the same engine Deployment (kvscale renders it) behind
its Service, scaled by a ScaledObject with KEDA's Prometheus trigger on
`sum(vllm:num_requests_waiting)`, once per tuning in `TUNINGS`: the guides' (an average of 5
waiting requests per replica, KEDA's 30 s polling, the HPA's 300 s scale-down stabilization) and
the one a user would try next (2 waiting, 5 s polling, 20 s stabilization, as kvscale's spec),
and on the demo's phases the sweep a user would go on with (`SWEEP`: 1 waiting request per
replica; a 60 s scale-down window). The like-for-like baseline is the cheapest KEDA run whose SLO
share is no lower than kvscale's (`keda_at_no_lower_slo_share`; none if no KEDA run reached it);
a second PNG puts every run on replica-seconds against SLO share.
Every engine container is held to its CPU limit (the spec's `500m`) by a CFS quota, as a kubelet
with `--cpu-cfs-quota` (its default) holds it: three replicas then take 1.5 of the machine's two
cores, and one serves as much beside two others as alone (runs before it enforced none, so a
replica beside two others served less than the one measured alone).
Each run replays the demo's phases (e2e/kvscale_demo: steady, rise, a 4x burst, quiet), their
rates scaled to one replica's capacity measured first on this machine (the burst is 1.5x it;
kvscale's spec declares it in tokens/s, each request counted as the engine's own counters count
it: runs before 1be2644 assumed 63 tokens a request where the engine counts about 87, so the
spec understated a replica by a quarter), and keeps the quiet rate until the Deployment is back
at one replica (at most `SETTLE_S`). Figures per run (e2e/kvscale_demo/figures.py `measure`) and the
kvscale/KEDA replica-seconds ratio land in bench/results/cluster_vs_keda.json, both timelines in
bench/results/cluster_vs_keda.png.
`--quick` shortens every phase to a quarter.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscale_cluster.binaries import keda_dir
from kvscale_cluster.cluster import Cluster
from kvscale_cluster.config import ClusterConfig
from kvscale_cluster.fixtures import kubectl, run_operator
from kvscale_cluster.install import ROOT
from kvscale_cluster.keda import start_keda
from kvscale_cluster.kube_api import KubeApi
from kvscale_cluster.wait import wait_for
from kvscale_demo import versus
from kvscale_demo.__main__ import PHASES
from kvscale_demo.figures import cheapest_no_worse, measure, timeline

PLOT = Path(__file__).parent / "results" / "cluster_vs_keda.png"
SETTLE_S = 180.0
TUNINGS = {
    "keda-guide": versus.KedaTuning(threshold=5, polling_s=30, scale_down_stabilization_s=300),
    "keda-tuned": versus.KedaTuning(threshold=2, polling_s=5, scale_down_stabilization_s=20),
}
# what a user tries after those two, on the demo's phases: a shorter queue per replica (scale out
# sooner), and a longer scale-down window (the tuned run dropped to one replica mid-burst, once
# its queue had been empty for 20 s)
SWEEP = {
    f"keda-q{q}-w{w}": versus.KedaTuning(threshold=q, polling_s=5, scale_down_stabilization_s=w)
    for q, w in ((1, 20), (2, 60))
}


def _namespace(api: KubeApi, name: str) -> str:
    api.post("/api/v1/namespaces", {"metadata": {"name": name}})
    path = f"/api/v1/namespaces/{name}/serviceaccounts/default"
    wait_for(lambda: api.get(path), 30, f"service account {name}/default")
    return name


def _remove(api: KubeApi, namespace: str) -> None:
    """Delete a run's namespace and wait until its pods are gone."""
    api.delete(f"/api/v1/namespaces/{namespace}")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    wait_for(lambda: not api.get(pods).get("items"), 120, f"the pods of {namespace} to go")


NO_MATPLOTLIB = "matplotlib is not installed: no PNG"


def _pyplot() -> Any:
    """matplotlib's pyplot drawing to files only, or None where matplotlib is not installed (it
    comes with the `tools` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _plot(runs: dict[str, dict[str, Any]], slo_s: float, path: Path, engine: str) -> str | None:
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for name, line in runs.items():
        samples = line["samples"]
        top.step([s["t"] for s in samples], [s["replicas"] for s in samples], where="post",
                 label=f"{name} pods")  # fmt: skip
        ttft = [(t, v) for t, v in line["ttft"] if v is not None]
        bottom.plot([t for t, _ in ttft], [v for _, v in ttft], ".", ms=2, label=name)
    first = next(iter(runs.values()))
    labelled = len(first["phases"]) <= 8  # a trace's steps are too many to name
    for i, (phase, lo, hi) in enumerate(first["phases"]):
        for axis in (top, bottom):
            axis.axvspan(lo, hi, color=("#e8f0fe", "#fef7e0", "#fce8e6", "#e6f4ea")[i % 4])
        if labelled:
            top.text((lo + hi) / 2, 0.2, phase, ha="center", fontsize=8)
    bottom.axhline(slo_s, color="red", lw=0.8, ls="--", label="TTFT SLO")
    top.set_ylabel("engine pods")
    bottom.set_ylabel("TTFT (s)")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds from the first phase")
    top.legend(loc="upper right", fontsize=8)
    bottom.legend(loc="upper right", fontsize=8, markerscale=4)
    fig.suptitle(f"kvscale vs KEDA + HPA on the local cluster ({engine} engines, same load, SLO)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path.relative_to(ROOT))


def _pareto(figures: dict[str, dict[str, Any]], path: Path) -> str | None:
    """Replica-seconds against SLO share, one point per run, when more than two KEDA runs ran."""
    if len(figures) <= 3:
        return None
    plt = _pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, axis = plt.subplots(figsize=(7, 4.5))
    for name, f in figures.items():
        mine = name == "kvscale"
        axis.plot(f["replica_seconds"], 100 * f["slo_share"], "*" if mine else "o",
                  ms=12 if mine else 7, color="C3" if mine else "C0")  # fmt: skip
        axis.annotate(name, (f["replica_seconds"], 100 * f["slo_share"]), fontsize=8,
                      xytext=(6, -12) if mine else (4, 4), textcoords="offset points")  # fmt: skip
    axis.set_xlabel("replica-seconds (fewer is cheaper)")
    axis.set_ylabel("10 s intervals within the SLO (%)")
    axis.set_title("kvscale and each KEDA tuning, one run each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path.relative_to(ROOT))


def run(quick: bool = False) -> dict[str, Any]:
    scale = 0.25 if quick else 1.0
    phases = [versus.Phase(p.name, p.rate, p.seconds * scale) for p in PHASES]
    return compare(
        lambda capacity: versus.scaled(phases, capacity), TUNINGS | SWEEP, SETTLE_S * scale, PLOT
    )


def compare(
    phases_for: Callable[[float], list[versus.Phase]],
    tunings: dict[str, versus.KedaTuning],
    settle_s: float,
    plot: Path,
    engine: str = "kvscale",
    lead_in_s: float = 0.0,
) -> dict[str, Any]:
    """kvscale, then KEDA with each of `tunings`, on one fresh cluster: the phases `phases_for`
    gives for one replica's measured capacity (requests/s), each run kept at the last phase's rate
    until the Deployment is back at one replica (at most `settle_s`). `engine` is what every run's
    Deployment serves (kvscale's engine, or vLLM: then every answer runs to its `max_tokens`);
    kvscale's spec declares the capacity measured: requests/s x the tokens a request cost, as
    the engine's own counters (those the law reads) counted them during the measurement. With
    `lead_in_s`, each run first holds the first phase's rate that long, outside the figures."""
    ignore_eos = engine == "vllm"
    phases: list[versus.Phase] = []
    figures: dict[str, dict[str, Any]] = {}
    calibration = versus.Calibration(0.0, 0.0)
    lines: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kvscale-vs-keda-") as work:
        config = dataclasses.replace(ClusterConfig.from_env(), cpu_cfs_quota=True)
        cluster = Cluster.start(Path(work) / "cluster", config)
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        keda = start_keda(cluster, keda_dir())
        api = KubeApi(cluster.api_url, cluster.token, str(cluster.ca_path))
        try:
            crd = ROOT / "crds" / "llmendpoints.kvscale.io.yaml"
            kubectl(cluster, "apply", "--server-side", "-f", str(crd))
            kubectl(cluster, "wait", "--for=condition=Established", "crd/llmendpoints.kvscale.io")
            # the demo's rates scaled to this machine: its burst is 1.5x what one replica
            # serves, and kvscale is told that capacity (its replicaCapacityTokensPerSecond)
            ns = _namespace(api, "vs-calibrate")
            url = versus.deploy_plain(api, ns, versus.endpoint_spec(engine=engine))
            calibration = versus.calibrate(url, ignore_eos=ignore_eos)
            _remove(api, ns)
            phases = phases_for(calibration.requests_per_s)
            spec = versus.endpoint_spec(calibration.tokens_per_s, engine)
            with run_operator(cluster):
                ns = _namespace(api, "vs-kvscale")
                url = versus.deploy_kvscale(api, ns, spec)
                result = versus.replay(
                    api, ns, url, "kvscale", phases, settle_s, ignore_eos=ignore_eos,
                    lead_in_s=lead_in_s,
                )  # fmt: skip
                endpoint = api.get(
                    f"/apis/kvscale.io/v1alpha1/namespaces/{ns}/llmendpoints/{versus.NAME}"
                )
                _remove(api, ns)  # its engines do not idle beside the next run
            figures["kvscale"], lines["kvscale"] = measure(result), timeline(result)
            # why it scaled when it did: the operator's own account (status.decisions)
            figures["kvscale"]["decisions"] = endpoint.get("status", {}).get("decisions", [])
            for name, tuning in tunings.items():
                ns = _namespace(api, f"vs-{name}")
                url = versus.deploy_plain(api, ns, spec)
                versus.add_scaled_object(api, cluster, ns, tuning)
                result = versus.replay(
                    api, ns, url, name, phases, settle_s, ignore_eos=ignore_eos,
                    lead_in_s=lead_in_s,
                )  # fmt: skip
                figures[name], lines[name] = measure(result), timeline(result)
                figures[name]["tuning"] = vars(tuning)
                _remove(api, ns)
        finally:
            api.close()
            keda.stop()
            cluster.stop()
    ratios = {
        name: round(figures["kvscale"]["replica_seconds"] / max(1e-9, f["replica_seconds"]), 3)
        for name, f in figures.items()
        if name != "kvscale"
    }
    pick = cheapest_no_worse(figures, "kvscale")
    shown = {n: line for n, line in lines.items() if n == "kvscale" or n in TUNINGS or n == pick}
    return {
        "engine": engine,
        "keda_version": keda_dir().name,
        # each engine container held to its CPU limit (the spec's 500m) by a CFS quota, as a
        # kubelet does: a replica serves the same whether it runs alone or beside two others
        "cpu_limits_enforced": config.cpu_cfs_quota,
        "engine_cpu_limit": spec["resources"]["cpu"],
        "replica_capacity_rps": round(calibration.requests_per_s, 2),
        "tokens_per_request": round(calibration.tokens_per_request, 1),
        "slo_ttft_p99_s": versus.SLO_TTFT_S,
        "slo_interval_s": versus.SLO_INTERVAL_S,
        "phases": [vars(p) for p in phases],
        # seconds at the first phase's rate before the phases, left out of every figure
        "lead_in_s": lead_in_s,
        "results": figures,
        "replica_seconds_ratio_kvscale_to": ratios,
        # the like-for-like figure: the cheapest KEDA run at no lower SLO share than kvscale's
        "keda_at_no_lower_slo_share": pick and {"run": pick, "ratio": ratios[pick]},
        "plot": _plot(shown, versus.SLO_TTFT_S, plot, engine),
        "pareto_plot": _pareto(figures, plot.with_name(plot.stem + "_pareto.png")),
        # the pods over time; each request's TTFT is in the PNG only (the JSON stays small)
        "timelines": {
            name: {k: v for k, v in line.items() if k != "ttft"} for name, line in lines.items()
        },
    }
