"""`decide_100_endpoints_ms`: the capacity law deciding one tick for 100 endpoints.

Each endpoint has its own `CapacityLaw` (the one the operator's capacity loop and the simulator
hold) fed 11 snapshots, as the previous ticks left it, and is timed taking the 12th (the law keeps
max(stabilization, 600 s) / interval + 2 snapshots: 12 at the 60 s default). Each snapshot has 4
replicas whose signals vary by endpoint (a seeded random walk: some rising, some flat, some idle,
some in trouble), so every branch of the law runs. Timed with `time.perf_counter` and
`time.process_time`; the median of 21 repetitions is reported with the worst.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from kvscale.controllers.capacity import CapacityLaw
from kvscale.signals.snapshot import Fleet, Latency, ReplicaSignals, Snapshot
from kvscale_cluster.specs import llm_spec

ENDPOINTS = 100
HISTORY = 12
REPLICAS = 4
INTERVAL = 60.0
TARGET_MS = 100.0


def _history(rng: random.Random) -> list[Snapshot]:
    base = rng.uniform(0, 8000)
    trend = rng.uniform(-50, 80)
    snaps = []
    for i in range(HISTORY):
        level = max(0.0, base + trend * i + rng.gauss(0, base * 0.05 + 1))
        waiting = rng.choice([0.0, 0.0, 0.0, rng.uniform(0, 20)])
        reps = tuple(
            ReplicaSignals(
                pod=f"r{j}",
                prompt_tokens_per_s=level / REPLICAS * 0.6,
                generation_tokens_per_s=level / REPLICAS * 0.4,
                running=rng.uniform(0, 16),
                waiting=waiting / REPLICAS,
                kv_usage=rng.uniform(0, 0.95),
                preemptions_per_s=rng.choice([0.0, 0.0, rng.uniform(0, 1)]),
                successes_per_s=level / 500,
                latency=Latency(ttft_p99=rng.uniform(0.1, 3), itl_p99=rng.uniform(0.01, 0.3)),
                created_at=1000.0 * j,
            )
            for j in range(REPLICAS)
        )
        snaps.append(
            Snapshot(
                taken_at=i * INTERVAL,
                window_s=INTERVAL,
                replicas=reps,
                latency=reps[0].latency,
                fleet=Fleet(current=REPLICAS, ready=REPLICAS, startup_seconds=90.0),
            )
        )
    return snaps


def measure(repetitions: int = 21) -> dict[str, Any]:
    rng = random.Random(42)
    spec = llm_spec(scaling={"maxReplicas": 64})
    endpoints = []
    for _ in range(ENDPOINTS):
        history = _history(rng)
        law = CapacityLaw()
        for snap in history[:-1]:  # warm-up: the law as the previous ticks left it
            law.decide(snap, spec, snap.taken_at)
        endpoints.append((law, history[-1]))
    walls, cpus = [], []
    for _ in range(repetitions):
        # each repetition times the same tick: a copy of each law as the warm-up left it
        laws = [(CapacityLaw(law.state, list(law.history)), snap) for law, snap in endpoints]
        wall, cpu = time.perf_counter(), time.process_time()
        for law, snap in laws:
            law.decide(snap, spec, snap.taken_at)
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return {
        "decide_100_endpoints_ms": round(statistics.median(walls), 3),
        "decide_100_endpoints_worst_ms": round(max(walls), 3),
        "decide_100_endpoints_cpu_ms": round(statistics.median(cpus), 3),
        "decide_target_ms": TARGET_MS,
        "decide_meets_target": statistics.median(walls) < TARGET_MS,
        "decide_what_ran": __doc__.split("\n\n")[1].replace("\n", " "),
    }
