"""The deferred queue: deferrable requests wait earliest-deadline-first for spare capacity.

A deferrable class (`deadlineSeconds`) promises completion by a deadline, not a fast first token,
so its requests need not buy capacity now: they wait here until a replica has room to spare, and
the capacity law counts only the rate their deadlines require. A replica is spare when it is not
hot and its outstanding tokens stay under its budget (the tokens the routing law lets it carry at
the SLO) with the request added; nothing is released into spare capacity while an interactive
request waits. Whatever the load, a request is released once its remaining time shrinks to a
safety multiple of its expected run time at the learned per-replica decode rate; one that could
not finish in time even on the fastest replica is refused with a reason instead of being late.

Pure logic: time and the replicas' state are passed in; release.py is the asynchronous side.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

# the due-time buckets of the backlog metric: tokens due within 1 min ... 1 day, and all of them;
# the operator reads the same bounds (kvscale/signals/deferred.py DUE_WITHIN; a test holds both)
DUE_BUCKETS_S = (
    60.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, math.inf,
)  # fmt: skip

ReleaseReason = Literal["spare", "deadline"]


class QueueFull(Exception):
    """The class's deferred queue is at its bound."""


class Unmeetable(Exception):
    """The request cannot finish before its deadline even on the fastest replica."""


@dataclass(eq=False)
class Deferred:
    """One queued request. Times are monotonic seconds."""

    traffic_class: str
    arrival: float
    deadline: float
    tokens: float  # prompt estimate + max output: what it may occupy on a replica
    output_tokens: int  # the most output it may ask for: what decoding must produce
    seq: int = 0  # arrival order, the tie-break among equal deadlines


@dataclass(frozen=True)
class Room:
    """One routable replica as the release rule sees it."""

    outstanding: float  # tokens in flight on it (every class)
    budget: float  # outstanding tokens it may carry and still be spare; 0: hot, no deferred work
    rate: float  # output tokens per second one request decodes at on it

    @property
    def hot(self) -> bool:
        return self.budget <= 0

    @property
    def spare(self) -> bool:
        return not self.hot and self.outstanding < self.budget


@dataclass(frozen=True)
class Release:
    request: Deferred
    replica: str
    reason: ReleaseReason
    valley: bool  # released while no interactive request waited and every replica was spare


@dataclass(frozen=True)
class Plan:
    releases: list[Release]
    unmeetable: list[Deferred]


@dataclass(frozen=True)
class Backlog:
    """What one class has queued: for the metrics and, through them, the capacity law."""

    requests: int
    oldest_age_s: float
    tokens_due: dict[float, float]  # cumulative: tokens due within each of DUE_BUCKETS_S


@dataclass(frozen=True)
class DeferralPolicy:
    """When a request must go, however loaded the replicas are."""

    safety: float = 2.0  # released once its time left is within safety x its expected run time
    margin_s: float = 5.0  # ... plus this (admission, prefill, a retry on another replica)
    prior_tokens_per_s: float = 10.0  # decode rate assumed before any deferred request completed

    def __post_init__(self) -> None:
        if self.safety < 1 or self.margin_s < 0 or not self.prior_tokens_per_s > 0:
            raise ValueError("safety must be >= 1, margin >= 0 and the prior rate > 0")

    def run_s(self, request: Deferred, rate: float) -> float:
        return request.output_tokens / rate

    def latest_start(self, request: Deferred, rate: float) -> float:
        return request.deadline - self.margin_s - self.safety * self.run_s(request, rate)

    def meetable(self, request: Deferred, now: float, rate: float) -> bool:
        return now + self.run_s(request, rate) <= request.deadline


@dataclass
class RateEstimate:
    """A replica's per-request decode rate from completed requests, shrunk towards a prior.

    Output tokens and seconds are summed with exponential forgetting; the prior counts as
    `prior_s` seconds at the prior rate, so a few fast requests do not make the rule bold.
    """

    prior_tokens_per_s: float
    prior_s: float = 30.0
    forget: float = 0.1
    tokens: float = 0.0
    seconds: float = 0.0

    def observe(self, output_tokens: int, seconds: float) -> None:
        if output_tokens <= 0 or seconds <= 0:
            return
        keep = 1.0 - self.forget
        self.tokens = keep * self.tokens + output_tokens
        self.seconds = keep * self.seconds + seconds

    @property
    def tokens_per_s(self) -> float:
        prior = self.prior_tokens_per_s * self.prior_s
        return (self.tokens + prior) / (self.seconds + self.prior_s)


class DeferredQueue:
    """Queued deferrable requests, earliest deadline first, bounded per class."""

    def __init__(self, bounds: Mapping[str, int], policy: DeferralPolicy | None = None) -> None:
        self.bounds = dict(bounds)
        self.policy = policy or DeferralPolicy()
        self._queued: dict[Deferred, None] = {}
        self._per_class = {name: 0 for name in self.bounds}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._queued)

    def __contains__(self, request: Deferred) -> bool:
        return request in self._queued

    def push(self, request: Deferred, now: float, best_rate: float) -> None:
        """Queue a request; raises QueueFull past the class's bound, Unmeetable when even the
        fastest replica (`best_rate`) could not finish it by its deadline."""
        if self._per_class.get(request.traffic_class, 0) >= self.bounds[request.traffic_class]:
            raise QueueFull(request.traffic_class)
        if not self.policy.meetable(request, now, best_rate):
            raise Unmeetable(request.traffic_class)
        request.seq = next(self._seq)
        self._queued[request] = None
        self._per_class[request.traffic_class] += 1

    def remove(self, request: Deferred) -> bool:
        """Take a request out (its client left); False when it is no longer queued."""
        if request not in self._queued:
            return False
        del self._queued[request]
        self._per_class[request.traffic_class] -= 1
        return True

    def earliest_first(self) -> list[Deferred]:
        return sorted(self._queued, key=lambda r: (r.deadline, r.seq))

    def plan(
        self,
        now: float,
        rooms: Mapping[str, Room],
        interactive_waiting: bool,
        slots: Mapping[str, int | None] | None = None,
    ) -> Plan:
        """What to release now and to where, and what can no longer make its deadline; both
        leave the queue. `slots`: requests each class may still start (None: unlimited)."""
        left = {name: room.outstanding for name, room in rooms.items()}
        free = dict(slots or {})
        valley = bool(rooms) and not interactive_waiting and all(r.spare for r in rooms.values())
        best = max((r.rate for r in rooms.values()), default=self.policy.prior_tokens_per_s)
        slowest = min((r.rate for r in rooms.values()), default=best)
        releases: list[Release] = []
        unmeetable: list[Deferred] = []
        for request in self.earliest_first():
            if not self.policy.meetable(request, now, best):
                unmeetable.append(request)
                continue
            cap = free.get(request.traffic_class)
            if cap is not None and cap <= 0:
                continue  # the class runs as many as it may
            target = self._target(request, now, rooms, left, interactive_waiting, slowest)
            if target is None:
                continue
            name, reason = target
            left[name] += request.tokens
            if cap is not None:
                free[request.traffic_class] = cap - 1
            releases.append(Release(request, name, reason, valley))
        for request in itertools.chain(unmeetable, (r.request for r in releases)):
            self.remove(request)
        return Plan(releases, unmeetable)

    def _target(
        self,
        request: Deferred,
        now: float,
        rooms: Mapping[str, Room],
        left: Mapping[str, float],
        interactive_waiting: bool,
        slowest: float,
    ) -> tuple[str, ReleaseReason] | None:
        fits = [
            n for n, r in rooms.items() if not r.hot and left[n] + request.tokens <= r.budget
        ]  # fmt: skip
        if fits and not interactive_waiting:  # spare: the most room relative to its budget
            return min(fits, key=lambda n: (left[n] / rooms[n].budget, n)), "spare"
        if rooms and now >= self.policy.latest_start(request, slowest):
            cool = [n for n, r in rooms.items() if not r.hot] or list(rooms)
            return min(cool, key=lambda n: (left[n] - rooms[n].budget, n)), "deadline"
        return None

    def next_due(self, rooms: Mapping[str, Room]) -> float | None:
        """When the earliest queued request must go at the latest (None: nothing queued)."""
        slowest = min((r.rate for r in rooms.values()), default=self.policy.prior_tokens_per_s)
        times = (self.policy.latest_start(r, slowest) for r in self._queued)
        return min(times, default=None)

    def backlog(self, now: float, classes: Iterable[str]) -> dict[str, Backlog]:
        """Per class: requests queued, the oldest one's age and the tokens due by each bucket."""
        out: dict[str, Backlog] = {}
        for name in classes:
            queued = [r for r in self._queued if r.traffic_class == name]
            due = {
                bound: sum(r.tokens for r in queued if r.deadline - now <= bound)
                for bound in DUE_BUCKETS_S
            }
            oldest = max((now - r.arrival for r in queued), default=0.0)
            out[name] = Backlog(len(queued), oldest, due)
        return out


@dataclass
class Rates:
    """The decode rate learned per replica."""

    prior_tokens_per_s: float
    estimates: dict[str, RateEstimate] = field(default_factory=dict)

    def observe(self, replica: str, output_tokens: int, seconds: float) -> None:
        estimate = self.estimates.setdefault(replica, RateEstimate(self.prior_tokens_per_s))
        estimate.observe(output_tokens, seconds)

    def of(self, replica: str) -> float:
        estimate = self.estimates.get(replica)
        return estimate.tokens_per_s if estimate else self.prior_tokens_per_s

    def forget(self, replicas: Iterable[str]) -> None:
        for name in replicas:
            self.estimates.pop(name, None)
