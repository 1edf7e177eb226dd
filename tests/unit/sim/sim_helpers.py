"""Small profiles, limits and batches for the simulator's unit tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvscale.sim.arrivals import Batch
from kvscale.sim.engine import Limits
from kvscale.sim.profile import EngineProfile, StartupTime

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"


def profile(kv_tokens: int = 100_000, startup_s: float = 30.0) -> EngineProfile:
    """A round-number replica: 20 ms decode steps (+ 0.1 ms per sequence), 10k prefill tok/s."""
    return EngineProfile(
        name="test",
        gpu="test-gpu",
        engine="test",
        model="test",
        gpus_per_replica=1,
        kv_tokens=kv_tokens,
        kv_bytes_per_token=1000,
        memory_bytes_per_s=1e12,
        prefill_tokens=(256.0, 4096.0),
        prefill_tokens_per_s=(10_000.0, 10_000.0),
        decode_batch=(1.0, 101.0),
        decode_context=(512.0,),
        decode_step_s=((0.020,), (0.030,)),
        startup=StartupTime(startup_s, 0.0),
        sources={},
    )


def limits(seqs: int = 64, batched: int = 2048, kv: int = 100_000, wait: float = 30.0) -> Limits:
    return Limits(seqs, batched, kv, 8192, wait)


def batch(n: int, t0: float, inp: int = 500, out: int = 50, span: float = 1.0) -> Batch:
    at = t0 + np.arange(n) * (span / max(n, 1))
    full = np.full(n, 1, dtype=np.int64)
    return Batch(at, full * inp, full * out, full * 0)
