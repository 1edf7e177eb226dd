"""kvscale against tuned KEDA + the HPA on the local cluster, replaying a slice of a public trace.

The same cluster, engines, SLO and runs as `cluster_vs_keda` (bench/cluster_vs_keda.py), with a
20-minute slice of the Azure LLM inference trace (2023, conversation) instead of the demo's
phases: of every 20-minute window of the trace's hour, the one whose busiest 30 s step is furthest
above its mean (e2e/kvscale_demo/trace_slice.py: the slice that asks most of an autoscaler), each
30 s step replayed at its own arrival rate, scaled so the busiest step runs at 1.5x what one
replica serves on this machine (as the demo's burst). Only the trace's arrival times are
replayed; every request is the demo's (a 15-word prompt of about 40 tokens, 48 generated).
kvscale runs with the demo's spec, its capacity as measured (`cluster_vs_keda`); KEDA with the
tuning that beat the guides' on the demo's phases (2 waiting requests per replica, 5 s polling,
20 s scale-down stabilization); the guides' tuning, which kept three replicas through a whole
quiet phase there, is not rerun. Both runs end with the slice (no settling), so
replica-seconds cover the same 20 minutes. Writes bench/results/cluster_vs_keda_trace.json and its
PNG. `--quick` replays 2 minutes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.cluster_vs_keda import TUNINGS, compare
from kvscale.traces import default_traces_dir, load_trace
from kvscale_demo.trace_slice import scaled_trace, trace_slice

TRACE = "azure-conv"
MINUTES, QUICK_MINUTES = 20.0, 2.0
STEP_S = 30.0
PLOT = Path(__file__).parent / "results" / "cluster_vs_keda_trace.png"


def run(quick: bool = False) -> dict[str, Any]:
    arrivals = [r.arrival_s for r in load_trace(TRACE, default_traces_dir())]
    part = trace_slice(
        [a for a in arrivals if a is not None], QUICK_MINUTES if quick else MINUTES, STEP_S
    )
    tuned = {"keda-tuned": TUNINGS["keda-tuned"]}
    result = compare(lambda capacity: scaled_trace(part, capacity), tuned, 0.0, PLOT)
    return result | {
        "trace": {
            "name": TRACE,
            "source": "Azure LLM inference trace 2023 (conversation), CC-BY-4.0",
            "slice_start_s": part.start_s,
            "minutes": len(part.phases) * STEP_S / 60,
            "step_s": STEP_S,
            "peak_to_mean": part.peak_to_mean,
            "rule": "the window whose busiest step is furthest above its mean; its busiest step "
            "at 1.5x one replica's measured capacity; only arrival times replayed",
        }
    }
