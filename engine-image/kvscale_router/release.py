"""Releasing deferred requests: the event-loop side of deferred.py.

Each deferrable request awaits its own future while it sits in the deferred queue. One
dispatcher task (run for the app's lifetime) plans again whenever a deferred request arrives or
any request finishes, and on a short tick while the queue is not empty (weights and deadlines
move without events); it resolves each released request's future with the replica it goes to,
or fails it with a refusal once its deadline can no longer be met. A client that leaves while
queued takes its request out. Released tokens count against their replica until the request has
actually started there, so two plans in a row do not both spend the same spare room.

A replica's budget is the `tokenBudgets` entry the operator publishes for it, else its weight x
`spare_tokens`; under `hot_weight` it is hot and its budget 0. The weight is the routing law's
verdict on the replica's load (queue, KV usage, preemptions, TTFT against the SLO), so a budget
that shrinks with it stops deferred work the moment the law calls the replica hot.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

from kvscale_router.admission import Admission, Refused, TrafficClass
from kvscale_router.config import RouterConfig
from kvscale_router.deferred import (
    DUE_BUCKETS_S,
    Deferred,
    DeferredQueue,
    QueueFull,
    Rates,
    Release,
    Room,
    Unmeetable,
)
from kvscale_router.hold import Hold
from kvscale_router.metrics import RouterMetrics
from kvscale_router.picker import Picker
from kvscale_router.replicas import ReplicaTable

TICK_S = 0.5
MAX_RETRY_AFTER_S = 60


def due_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


class Releaser:
    def __init__(
        self,
        config: RouterConfig,
        table: ReplicaTable,
        picker: Picker,
        admission: Admission,
        hold: Hold,
        metrics: RouterMetrics,
    ) -> None:
        self.config = config
        self.table = table
        self.picker = picker
        self.admission = admission
        self.hold = hold
        self.metrics = metrics
        self.classes = tuple(c for c in admission.classes if c.deferrable)
        self.queue = DeferredQueue({c.name: c.max_queue for c in self.classes}, config.deferral)
        self.rates = Rates(config.deferral.prior_tokens_per_s)
        self._waiting: dict[Deferred, asyncio.Future[Release]] = {}
        self._promised: dict[str, float] = {}
        self._kick = asyncio.Event()

    # the request's side

    async def wait(self, request: Deferred) -> Release:
        """Return once the request is released; raises Refused when the queue is full or its
        deadline cannot be met."""
        now = time.monotonic()
        rooms = self.rooms()
        best = max((r.rate for r in rooms.values()), default=self.rates.prior_tokens_per_s)
        try:
            self.queue.push(request, now, best)
        except QueueFull:
            retry = self._retry_after_s(now, rooms)
            message = (f"Traffic class {request.traffic_class!r} has as many deferred requests "
                       "queued as it may.")  # fmt: skip
            raise Refused(429, "queue_full", retry, request.traffic_class, message) from None
        except Unmeetable:
            self.metrics.deferred_missed.labels(request.traffic_class, "refused").inc()
            self.metrics.deferred_completed.labels(request.traffic_class, "missed").inc()
            raise self._unmeetable(request, now, best) from None
        future: asyncio.Future[Release] = asyncio.get_running_loop().create_future()
        self._waiting[request] = future
        self.kick()
        try:
            return await future
        except asyncio.CancelledError:  # the client left
            released = future.done() and not future.cancelled() and future.exception() is None
            if not self.queue.remove(request) and released:  # released as it left
                self.settle(future.result())
            raise
        finally:
            del self._waiting[request]

    def settle(self, release: Release) -> None:
        """The released request started on a replica (or never will): stop counting it here."""
        name = release.replica
        self._promised[name] = max(0.0, self._promised.get(name, 0.0) - release.request.tokens)

    def finished(self, release: Release, replica: str, output_tokens: int | None,
                 seconds: float, complete: bool) -> None:  # fmt: skip
        """A released request's response ended: learn the replica's rate, count the outcome and
        the tokens served (the prompt estimate plus the output counted, else the most asked)."""
        m, request = self.metrics, release.request
        if complete:
            if output_tokens is not None:
                self.rates.observe(replica, output_tokens, seconds)
            late = time.monotonic() > request.deadline
            m.deferred_completed.labels(request.traffic_class, "missed" if late else "met").inc()
            if late:
                m.deferred_missed.labels(request.traffic_class, "late").inc()
            prompt = max(0.0, request.tokens - request.output_tokens)
            served = prompt + (request.output_tokens if output_tokens is None else output_tokens)
            m.deferred_served_tokens.labels(request.traffic_class, release.reason).inc(served)

    def kick(self) -> None:
        """Plan again soon: capacity may have freed or work arrived."""
        if len(self.queue):
            self._kick.set()

    # the dispatcher

    async def run(self) -> None:
        while True:
            self.step(time.monotonic())
            timeout = TICK_S if len(self.queue) else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout)
            self._kick.clear()

    def step(self, now: float) -> None:
        rooms = self.rooms()
        slots = {c.name: self.admission.free_slots(c) for c in self.classes}
        plan = self.queue.plan(now, rooms, self.interactive_waiting(), slots)
        m = self.metrics
        for release in plan.releases:
            cls, tokens = release.request.traffic_class, release.request.tokens
            self._promised[release.replica] = self._promised.get(release.replica, 0.0) + tokens
            m.deferred_released.labels(cls, release.reason).inc()
            if release.valley:
                m.valley_tokens.labels(cls).inc(tokens)
            future = self._waiting.get(release.request)
            if future is None or future.done():  # its client is leaving
                self.settle(release)
            else:
                future.set_result(release)
        best = max((r.rate for r in rooms.values()), default=self.rates.prior_tokens_per_s)
        for request in plan.unmeetable:
            m.deferred_missed.labels(request.traffic_class, "expired").inc()
            m.deferred_completed.labels(request.traffic_class, "missed").inc()
            future = self._waiting.get(request)
            if future is not None and not future.done():
                future.set_exception(self._unmeetable(request, now, best))

    def rooms(self) -> dict[str, Room]:
        published = self.table.published
        budgets = published.token_budgets if published is not None else {}
        rooms: dict[str, Room] = {}
        for name, weight in self.table.routable().items():
            budget = budgets.get(name, weight * self.config.spare_tokens)
            if weight < self.config.hot_weight:
                budget = 0.0
            outstanding = self.picker.tokens.get(name, 0.0) + self._promised.get(name, 0.0)
            rooms[name] = Room(outstanding, budget, self.rates.of(name))
        return rooms

    def interactive_waiting(self) -> bool:
        queued = sum(self.admission.depth(c) for c in self.admission.classes if not c.deferrable)
        return queued > 0 or self.hold.pending > 0

    # metrics

    def show(self, now: float) -> None:
        """Set the backlog gauges (at scrape time: ages and due times move with the clock)."""
        m = self.metrics
        for name, backlog in self.queue.backlog(now, [c.name for c in self.classes]).items():
            m.deferred_requests.labels(name).set(backlog.requests)
            m.deferred_oldest.labels(name).set(backlog.oldest_age_s)
            for bound in DUE_BUCKETS_S:
                m.deferred_tokens.labels(name, due_label(bound)).set(backlog.tokens_due[bound])
        if self.classes:
            for name in self.table.pods:
                m.decode_rate.labels(name).set(self.rates.of(name))

    def forget(self, replicas: set[str]) -> None:
        self.rates.forget(replicas)
        for name in replicas:
            self._promised.pop(name, None)
            with contextlib.suppress(KeyError):
                self.metrics.decode_rate.remove(name)

    # refusals

    def _unmeetable(self, request: Deferred, now: float, rate: float) -> Refused:
        left = max(0.0, request.deadline - now)
        needed = self.queue.policy.run_s(request, rate)
        message = (
            f"The deadline of this {request.traffic_class!r} request cannot be met: {left:.0f} s "
            f"left, and its {request.output_tokens} output tokens take about {needed:.0f} s at "
            f"{rate:.1f} tokens/s per request on the fastest replica."
        )
        retry = self._retry_after_s(now, self.rooms())
        return Refused(503, "deadline_unmeetable", retry, request.traffic_class, message)

    def _retry_after_s(self, now: float, rooms: dict[str, Room]) -> int:
        """Until the earliest queued request must go (a place frees then at the latest)."""
        due = self.queue.next_due(rooms)
        wait = 1.0 if due is None else due - now
        return int(min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait))))


def deferred_of(cls: TrafficClass, arrival: float, tokens: float, output_tokens: int) -> Deferred:
    assert cls.deadline_s is not None
    return Deferred(cls.name, arrival, arrival + cls.deadline_s, tokens, output_tokens)
