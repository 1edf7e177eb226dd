"""The rate a deferred backlog must be served at to meet its deadlines. A pure function.

Deferred work is not demand now: what the capacity law must provide for it is, over every
deadline horizon h, the tokens due within h spread over h; the largest such rate. Work due in an
hour is an hour's slow trickle, not a burst, and the spare capacity of the replicas already
running serves it first. Horizons are the upper bounds of the routers' due-time buckets, so a
bucket's tokens are taken as due at its end; the router releases work early enough to finish in
any case (and reports a request it can no longer finish in time).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from kvscale.api.v1alpha1 import DEADLINE_LIMIT
from kvscale.signals.snapshot import DeferredBacklog


def required_tokens_per_s(backlogs: Sequence[DeferredBacklog]) -> float:
    """max over horizons h of (tokens due within h) / h, over all deferrable classes together."""
    horizons = sorted({_finite(h) for b in backlogs for h, _ in b.due if h > 0})
    best = 0.0
    for h in horizons:
        due = sum(_due_within(b, h) for b in backlogs)
        best = max(best, due / h)
    return best


def _due_within(backlog: DeferredBacklog, horizon: float) -> float:
    """A class's tokens due within `horizon`: its cumulative count at the largest bound below."""
    bounds = [_finite(h) for h, _ in backlog.due]
    i = bisect.bisect_right(bounds, horizon)
    return backlog.due[i - 1][1] if i else 0.0


def _finite(horizon: float) -> float:
    """+Inf holds every held request: none may be due later than the longest deadline allowed."""
    return float(DEADLINE_LIMIT) if math.isinf(horizon) else horizon
