"""`python -m bench [name ...] [--quick]`: run benchmarks, write bench/results/<name>.json."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from bench.machine import describe

RESULTS = Path(__file__).parent / "results"
# the local-cluster harness (free ports, spec builders, the cluster) is not installed with
# kvscale: the benchmarks (and the processes they start) find it in the source tree, as the
# tests do (pytest's `pythonpath`)
HARNESS = Path(__file__).resolve().parent.parent / "e2e"

# name -> module with `run(quick: bool) -> dict`; results land in bench/results/<name>.json
BENCHMARKS = {
    "engine_throughput": "bench.engine_throughput",
    "prefix_cache": "bench.prefix_cache",
    "kv_waste": "bench.kv_waste",
    "server_overhead": "bench.server_overhead",
    "engine_vs_vllm": "bench.engine_vs_vllm",
    "peer_client": "bench.peer_client",
    "admission": "bench.admission",
    "deferred_preemption": "bench.deferred_preemption",
    "operator_scale": "bench.operator_scale",
    "service_proxy": "bench.service_proxy",
    "router_overhead": "bench.router_overhead",
    "router_prefix": "bench.router_prefix",
    "router_reweight": "bench.router_reweight",
    "profile": "bench.profile",
    "capacity_sim": "bench.capacity_sim",
    "sim_step": "bench.sim_step",
    "cluster_vs_keda": "bench.cluster_vs_keda",
    "cluster_vs_keda_trace": "bench.cluster_vs_keda_trace",
    "cluster_vs_keda_vllm": "bench.cluster_vs_keda_vllm",
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[[], *BENCHMARKS], default=[])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if str(HARNESS) not in sys.path:  # for this process, and the benchmarks' own children
        sys.path.append(str(HARNESS))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), str(HARNESS)) if p
        )
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(BENCHMARKS):
        machine = describe()
        start = time.perf_counter()
        result = importlib.import_module(BENCHMARKS[name]).run(quick=args.quick)
        result |= {"benchmark": name, "wall_s": round(time.perf_counter() - start, 1)}
        result["machine"] = machine
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{name}: wrote {path} in {result['wall_s']} s")


if __name__ == "__main__":
    main()
