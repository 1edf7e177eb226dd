"""Each request's prefill time on an idle replica of a profile, and the TTFT SLO's verdict on it.

On an idle replica a prompt is prefilled in chunks of at most `maxNumBatchedTokens`, at the
profile's prefill rate for that chunk, after its cached prefix; the first token comes with the
last chunk (as the simulator's engine computes it). `controllers.feasibility` judges the SLO.
"""

from __future__ import annotations

import numpy as np

from kvscale.controllers.feasibility import Feasibility
from kvscale.sim.arrivals import Shapes
from kvscale.sim.engine import Limits
from kvscale.sim.profile import EngineProfile


def idle_prefill_s(profile: EngineProfile, limits: Limits, shapes: Shapes) -> np.ndarray:
    tokens = np.maximum(shapes.input - shapes.cached, 1).astype(np.float64)
    chunk = np.minimum(tokens, float(limits.max_num_batched_tokens))
    return np.asarray(tokens / profile.prefill_rate(chunk), dtype=np.float64)


def assess(
    profile: EngineProfile, limits: Limits, shapes: Shapes, slo_s: float, attainment: float
) -> Feasibility:
    """The SLO against the share of requests whose prefill alone exceeds it."""
    prefill = idle_prefill_s(profile, limits, shapes)
    if len(prefill) == 0:
        return Feasibility(slo_s, attainment, 0.0, 0.0)
    at_target = float(np.quantile(prefill, attainment))
    return Feasibility(slo_s, attainment, at_target, float(np.mean(prefill > slo_s)))
