"""The simulated endpoint: replicas that start, become Ready, drain and go, and a router in front.

It does what the operator, the Deployment and the router do to replicas: a scale-up creates pods
that become Ready after a start-up time drawn from the profile; a scale-in first drops pods that
are not Ready yet, then drains the named victim (or the least-loaded Ready pod): the router stops
sending it requests, and it is removed once its queue and batch are empty, so no request fails
because of a scale-in; a scale-up while a pod drains takes the drain back first. The router sends
each arrival to the least-loaded routable replica (fewest requests queued or running) and holds
requests while no replica is Ready, exposing the held count as the scale-from-zero signal.
"Least-loaded" means fewest queued requests, ties broken by the running batch as a share of
`maxNumSeqs`: a fresh replica is not flooded with a full batch's worth of prompts at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from statistics import median

import numpy as np

from kvscale.signals.snapshot import Fleet
from kvscale.sim.arrivals import Batch
from kvscale.sim.engine import Deferred, Engines, F, IntA, Limits
from kvscale.sim.profile import EngineProfile

RECENT_STARTUPS = 5


@dataclass
class Replica:
    slot: int
    pod: str
    created_at: float
    ready_at: float
    draining: bool = False

    def ready(self, t: float) -> bool:
        return self.ready_at <= t


class Endpoint:
    def __init__(
        self,
        name: str,
        profile: EngineProfile,
        limits: Limits,
        max_replicas: int,
        rng: np.random.Generator,
    ) -> None:
        self.name, self.profile, self.rng = name, profile, rng
        self.slots = max(2 * max_replicas + 4, 8)
        self.engines = Engines(profile, limits, self.slots)
        self.replicas: dict[int, Replica] = {}
        self._free = list(range(self.slots - 1, -1, -1))
        self._serial = 0
        self.startups: deque[float] = deque(maxlen=RECENT_STARTUPS)
        self.unschedulable = 0

    # --- what the API server would say ------------------------------------------------------

    def active(self) -> list[Replica]:
        return [r for r in self.replicas.values() if not r.draining]

    def ready(self, t: float) -> list[Replica]:
        return [r for r in self.replicas.values() if r.ready(t)]

    def fleet(self, t: float) -> Fleet:
        starting = sum(1 for r in self.replicas.values() if not r.ready(t))
        return Fleet(
            current=len(self.replicas),
            ready=len(self.ready(t)),
            starting=starting,
            unschedulable=self.unschedulable,
            unschedulable_reason="no free simulated GPU slot" if self.unschedulable else "",
            startup_seconds=median(self.startups) if self.startups else None,
        )

    # --- actuation ----------------------------------------------------------------------------

    def scale_to(
        self, desired: int, t: float, victim: str | None = None, instant: bool = False
    ) -> None:
        active = self.active()
        if desired > len(active):
            need = desired - len(active)
            for r in sorted(self._draining(), key=lambda r: -self.engines.in_slot(r.slot))[:need]:
                r.draining = False  # the drain is undone
                need -= 1
            self.unschedulable = 0
            for _ in range(need):
                if not self._create(t, instant):
                    self.unschedulable += 1
        elif desired < len(active):
            self._remove(len(active) - desired, t, victim)

    def _create(self, t: float, instant: bool) -> bool:
        if not self._free:
            return False
        slot = self._free.pop()
        self.engines.reset_slot(slot)
        startup = 0.0 if instant else self.profile.startup.sample(self.rng)
        self._serial += 1
        pod = f"{self.name}-{self._serial:06d}"
        self.replicas[slot] = Replica(slot, pod, t, t + startup)
        return True

    def _remove(self, count: int, t: float, victim: str | None) -> None:
        starting = sorted((r for r in self.active() if not r.ready(t)), key=lambda r: -r.created_at)
        for r in starting[:count]:  # a pod that is not Ready has nothing to drain
            self._delete(r)
            count -= 1
        if count <= 0:
            return
        loads = self.engines.outstanding()
        ready = sorted((r for r in self.active() if r.ready(t)), key=lambda r: loads[r.slot])
        named = [r for r in ready if r.pod == victim]
        order = named + [r for r in ready if r.pod != victim]
        for r in order[:count]:
            r.draining = True

    def _draining(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.draining]

    def _delete(self, r: Replica) -> None:
        del self.replicas[r.slot]
        self._free.append(r.slot)

    # --- time passes ----------------------------------------------------------------------------

    def settle(self, t: float) -> None:
        """Pods that became Ready are measured; drained pods are removed."""
        for r in list(self.replicas.values()):
            if r.draining and self.engines.in_slot(r.slot) == 0:
                self._delete(r)

    def became_ready(self, t0: float, t1: float) -> None:
        for r in self.replicas.values():
            if t0 < r.ready_at <= t1 and r.ready_at > r.created_at:
                self.startups.append(r.ready_at - r.created_at)

    def routable(self, t: float) -> list[int]:
        return [r.slot for r in self.replicas.values() if r.ready(t) and not r.draining]

    def route(self, batch: Batch, t: float, deferred: Deferred | None = None) -> None:
        routable = self.routable(t)
        held = self.engines.held()
        if not routable:
            self.engines.add(batch, np.full(len(batch), -1, dtype=np.int64), deferred)
            return
        slots = np.array(routable, dtype=np.int64)
        load = self._load(slots)
        if held:
            self.engines.place_held(self._spread(slots, load, held))
            load = self._load(slots)
        if len(batch):
            self.engines.add(batch, self._spread(slots, load, len(batch)), deferred)

    def _load(self, slots: IntA) -> F:
        """Queued requests, plus the running batch as a share of maxNumSeqs (ties)."""
        e = self.engines
        placed = e.rep >= 0
        queued = np.bincount(e.rep[placed & ~e.running], minlength=self.slots)
        running = np.bincount(e.rep[placed & e.running], minlength=self.slots)
        return (queued + running / e.limits.max_num_seqs)[slots].astype(float)

    def _spread(self, slots: IntA, load: F, n: int) -> IntA:
        """Water-filling: arrivals go to the least-loaded replicas until loads level out."""
        order = np.argsort(load, kind="stable")
        lv = load[order]
        k = np.arange(1, len(lv) + 1)
        level = (n + np.cumsum(lv)) / k
        fits = np.flatnonzero(level >= lv)
        m = int(fits[-1]) + 1
        top = level[m - 1]
        counts = np.floor(top - lv[:m]).astype(np.int64)
        extra = min(n - int(counts.sum()), m)  # fewer than m by construction
        if extra > 0:
            counts[self.rng.choice(m, size=extra, replace=False)] += 1
        out = np.repeat(slots[order[:m]], counts)
        return self.rng.permutation(out)
