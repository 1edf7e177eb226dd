"""The router's deferred queue, simulated: earliest deadline first, released into spare capacity.

Deferrable requests wait here, not in an engine. Each step the queue releases, earliest deadline
first, as many tokens as the routable replicas have to spare: `FILL` of their capacity at the SLO
less the interactive tokens/s they were sent lately (a moving average), carried over at most
`BURST_S` seconds. Released requests run at the lowest engine priority (admitted and prefilled
after every interactive request of their replica), so interactive work goes first. A request is
released regardless of spare capacity `FINISH_MARGIN_S` before its deadline (to finish in time),
and one whose deadline passes while held is refused as too late (a missed deadline).
`backlog()` is what the router exports (signals/deferred.py): the held requests, their age, and
their tokens due within each bucket of `DUE_WITHIN`.
"""

from __future__ import annotations

import math

import numpy as np

from kvscale.signals.deferred import DUE_WITHIN
from kvscale.signals.snapshot import DeferredBacklog
from kvscale.sim.arrivals import Batch
from kvscale.sim.endpoint import Endpoint
from kvscale.sim.engine import Deferred, F

FILL = 0.85  # share of a replica's capacity at the SLO that interactive plus deferred may use
BURST_S = 5.0  # unused spare capacity carries over at most this long
FINISH_MARGIN_S = 300.0  # released at the latest this long before the deadline
AVERAGE_S = 30.0  # the interactive rate's moving-average time constant
BOUNDS = (*(float(b) for b in DUE_WITHIN), math.inf)


class DeferralQueue:
    def __init__(self, capacity_tokens_per_s: float) -> None:
        self.capacity = capacity_tokens_per_s
        self.interactive_rate = 0.0
        self.budget = 0.0
        self.missed = 0  # refused as too late while held
        z, zi = np.zeros(0), np.zeros(0, dtype=np.int64)
        self.at, self.deadline, self.inp, self.out, self.cached = z, z, zi, zi, zi

    def __len__(self) -> int:
        return len(self.at)

    def hold(self, batch: Batch, deadline_s: F) -> None:
        """New deferrable arrivals, each due `deadline_s` after it arrived."""
        self.at = np.concatenate([self.at, batch.at])
        self.deadline = np.concatenate([self.deadline, batch.at + deadline_s])
        self.inp = np.concatenate([self.inp, batch.input])
        self.out = np.concatenate([self.out, batch.output])
        self.cached = np.concatenate([self.cached, batch.cached])
        self._keep(np.argsort(self.deadline, kind="stable"))

    def saw_interactive(self, tokens: float, dt: float) -> None:
        w = min(1.0, dt / AVERAGE_S)
        self.interactive_rate += w * (tokens / dt - self.interactive_rate)

    def release(self, ep: Endpoint, t: float, dt: float) -> None:
        """Spare capacity first (EDF), then whatever must start now to meet its deadline."""
        if not len(self):
            return
        routable = ep.routable(t)
        spare = FILL * self.capacity * len(routable) - self.interactive_rate
        self.budget = min(self.budget + max(spare, 0.0) * dt, max(spare, 0.0) * BURST_S)
        late = self.deadline <= t
        if late.any():
            self.missed += int(late.sum())
            self._keep(~late)
        tokens = (self.inp + self.out).astype(float)
        valley = np.cumsum(tokens) <= self.budget  # a prefix: earliest deadlines first
        forced = ~valley & (self.deadline - t <= FINISH_MARGIN_S)
        go = valley | forced
        if not go.any() or not routable:
            return
        self.budget -= float(tokens[valley].sum())
        idx = np.flatnonzero(go)
        batch = Batch(np.full(len(idx), t), self.inp[idx], self.out[idx], self.cached[idx])
        deferred = Deferred(
            deadline=self.deadline[idx],
            limit=np.maximum(self.deadline[idx] - t, 1.0),
            low=np.ones(len(idx), dtype=bool),
            valley=valley[idx],
        )
        ep.route(batch, t, deferred)
        self._keep(~go)

    def backlog(self, t: float, served: float, valley: float) -> DeferredBacklog:
        """What the router exports: held requests, oldest age, tokens due within each bound."""
        tokens = np.cumsum((self.inp + self.out).astype(float))
        ends = np.searchsorted(self.deadline - t, BOUNDS, side="right")
        due = tuple(
            (b, float(tokens[e - 1]) if e else 0.0) for b, e in zip(BOUNDS, ends, strict=True)
        )
        return DeferredBacklog(
            traffic_class="batch",
            requests=float(len(self)),
            oldest_age_s=float(t - self.at.min()) if len(self) else None,
            due=due,
            served_tokens_per_s=served,
            valley_tokens_per_s=valley,
        )

    def _keep(self, keep: np.ndarray) -> None:  # type: ignore[type-arg]
        for name in ("at", "deadline", "inp", "out", "cached"):
            setattr(self, name, getattr(self, name)[keep])
