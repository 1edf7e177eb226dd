"""The routing weights the operator publishes (ConfigMap `<endpoint>-routing`, key weights.json).

`{"weights": {"<pod>": 0.0..1.0}, "updatedAt": "RFC3339", "reason": "..."}`. A pod missing from
the map gets 1.0 once it has been Ready for the warm-up, else 0, so that a fresh endpoint is
served before the operator has published anything.

Optionally `"tokenBudgets": {"<pod>": tokens}`: the outstanding tokens (prompt + requested
output, as the router counts them) the routing law lets each replica carry at the SLO. Deferred
requests are released into a replica only below its budget; a pod without one is given
`weight x --deferred-spare-tokens` (release.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WEIGHTS_KEY = "weights.json"


class WeightsError(ValueError):
    """The published weights cannot be read; the router keeps the last good ones."""


@dataclass(frozen=True)
class Published:
    weights: Mapping[str, float] = field(default_factory=dict)
    updated_at: str | None = None
    reason: str | None = None
    token_budgets: Mapping[str, float] = field(default_factory=dict)


def parse_weights(text: str) -> Published:
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WeightsError(f"{WEIGHTS_KEY} is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("weights", {}), dict):
        raise WeightsError(f'{WEIGHTS_KEY} must be an object with a "weights" object')
    weights: dict[str, float] = {}
    for pod, value in raw.get("weights", {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WeightsError(f"weight of {pod!r} is not a number: {value!r}")
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise WeightsError(f"weight of {pod!r} must be within [0, 1], got {value}")
        weights[str(pod)] = float(value)
    updated, reason = raw.get("updatedAt"), raw.get("reason")
    budgets = _token_budgets(raw.get("tokenBudgets") or {})
    return Published(
        weights, str(updated) if updated else None, str(reason) if reason else None, budgets
    )


def _token_budgets(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise WeightsError('"tokenBudgets" must be an object of token counts')
    budgets: dict[str, float] = {}
    for pod, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WeightsError(f"token budget of {pod!r} is not a number: {value!r}")
        if not math.isfinite(value) or value < 0:
            raise WeightsError(f"token budget of {pod!r} must be >= 0, got {value}")
        budgets[str(pod)] = float(value)
    return budgets


def from_configmap(data: Mapping[str, str] | None) -> Published | None:
    """The weights in a ConfigMap's data; None when it holds none yet (an empty ConfigMap)."""
    text = (data or {}).get(WEIGHTS_KEY)
    return parse_weights(text) if text and text.strip() else None


def effective_weight(
    pod: str, ready_for_s: float, published: Published | None, warmup_s: float
) -> float:
    if published is not None and pod in published.weights:
        return published.weights[pod]
    return 1.0 if ready_for_s >= warmup_s else 0.0
