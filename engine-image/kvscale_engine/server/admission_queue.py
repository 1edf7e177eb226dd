"""The admission wait queue: each request is admitted at once, waits its turn, or is refused.

`AdmissionController` (admission.py) decides, with time passed in; this class lives on the event
loop: a queued request awaits its own future until a slot frees or its class's maximum wait runs
out, and a client that leaves while queued gives its place up. It also counts the requests
admitted or queued and not yet released, so a drain can wait until none is left. When the
concurrency limit is not pinned it follows the measured length of requests (`KvFootprint`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

from kvscale_engine.server.admission import (
    AdmissionController,
    KvFootprint,
    TrafficClass,
    derive_concurrency_limit,
)
from kvscale_engine.server.config import ServerConfig
from kvscale_engine.server.metrics import EngineMetrics

log = logging.getLogger(__name__)


class Refused(Exception):
    """The request was not admitted: 429 (overload) or 503 (loading, draining)."""

    def __init__(self, status: int, reason: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass
class Admitted:
    ticket: int
    traffic_class: TrafficClass
    arrival: float
    released: bool = False
    used_tokens: int | None = None  # KV tokens its sequences reached, set when it ends
    first_token_at: float | None = None  # when its first token came, if one did


@dataclass(frozen=True)
class KvPool:
    """What the concurrency limit is derived from: the KV pool and the engine's sequence cap."""

    num_blocks: int
    block_size: int
    max_num_seqs: int

    def limit(self, tokens_per_request: float) -> int:
        return derive_concurrency_limit(
            self.num_blocks, self.block_size, tokens_per_request, self.max_num_seqs
        )


class AdmissionQueue:
    def __init__(
        self,
        controller: AdmissionController,
        metrics: EngineMetrics,
        pool: KvPool,
        footprint: KvFootprint | None = None,  # given: the limit follows request lengths
    ) -> None:
        self.controller = controller
        self.metrics = metrics
        self.pool = pool
        self._footprint = footprint
        self._tickets = itertools.count()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @classmethod
    def for_server(
        cls, config: ServerConfig, pool: KvPool, metrics: EngineMetrics
    ) -> AdmissionQueue:
        """Admission as the server's settings ask: off, pinned, or following request lengths."""
        if not config.admission:
            unlimited = tuple(
                TrafficClass(c.name, c.priority, None, 1 << 30, float("inf"), c.deadline_s)
                for c in config.traffic_classes
            )
            return cls(AdmissionController(unlimited, None), metrics, pool)
        if config.max_concurrency is not None:
            log.info("Admission limited concurrency to %d requests", config.max_concurrency)
            return cls(
                AdmissionController(config.traffic_classes, config.max_concurrency), metrics, pool
            )
        footprint = KvFootprint(config.max_model_len)
        limit = pool.limit(footprint.expected_tokens)
        log.info("Admission starts at %d requests and follows request lengths", limit)
        return cls(AdmissionController(config.traffic_classes, limit), metrics, pool, footprint)

    @property
    def active(self) -> int:
        """Requests admitted or queued and not yet released."""
        return self._active

    @property
    def queued(self) -> int:
        return self.controller.queued

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is admitted or queued; True when none is left in time."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def admit(self, class_name: str | None, kv_tokens: int, arrival: float) -> Admitted:
        """Admit (or queue, or refuse) a request that may grow to `kv_tokens` KV tokens."""
        cls = self.controller.resolve(class_name)
        if self._footprint is not None:
            self._footprint.asked(kv_tokens)
            self._retune(arrival)
        ticket = next(self._tickets)
        verdict = self.controller.offer(ticket, cls, arrival)
        if verdict.outcome == "reject":
            assert verdict.reason is not None
            raise self._refuse(verdict.reason, cls, verdict.retry_after_s)
        self._active += 1
        self._idle.clear()
        admitted = Admitted(ticket, cls, arrival)
        if verdict.outcome == "queue":
            await self._wait_in_queue(admitted)
        self.metrics.observe_queue_wait(cls.name, time.monotonic() - arrival)
        return admitted

    def release(self, admitted: Admitted) -> None:
        if admitted.released:
            return
        admitted.released = True
        now = time.monotonic()
        self._wake(self.controller.release(admitted.ticket, now, admitted.first_token_at))
        if self._footprint is not None and admitted.used_tokens is not None:
            self._footprint.used(admitted.used_tokens)
            self._retune(now)
        self._done()

    def refresh_load_metrics(self) -> None:
        for name, (queued, in_flight) in self.controller.load().items():
            self.metrics.set_admission_load(name, queued, in_flight)

    def _done(self) -> None:
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    def _wake(self, tickets: list[int]) -> None:
        for ticket in tickets:
            waiter = self._waiters.pop(ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _retune(self, now: float) -> None:
        """Follow the measured request length with the concurrency limit (when not pinned)."""
        assert self._footprint is not None
        limit = self.pool.limit(self._footprint.expected_tokens)
        if limit != self.controller.limit:
            self._wake(self.controller.set_limit(limit, now))

    async def _wait_in_queue(self, admitted: Admitted) -> None:
        cls = admitted.traffic_class
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[admitted.ticket] = waiter
        deadline = admitted.arrival + cls.max_queue_wait_s
        try:
            await asyncio.wait({waiter}, timeout=max(0.0, deadline - time.monotonic()))
        except asyncio.CancelledError:  # the client left while queued
            self._leave_queue(admitted)
            raise
        if not waiter.done():
            self._leave_queue(admitted, timed_out=True)
            raise self._refuse("timeout", cls, 1.0)

    def _leave_queue(self, admitted: Admitted, timed_out: bool = False) -> None:
        self._waiters.pop(admitted.ticket, None)
        now = time.monotonic() if timed_out else None
        if self.controller.cancel(admitted.ticket, timed_out_at=now):
            admitted.released = True
            self._done()
        else:  # it was admitted in the same instant
            self.release(admitted)

    def _refuse(self, reason: str, cls: TrafficClass, retry_after_s: float) -> Refused:
        self.metrics.observe_rejection(reason, cls.name)
        if reason == "draining":
            return Refused(503, reason, retry_after_s, "the server is draining")
        return Refused(
            429, reason, retry_after_s, f"traffic class {cls.name!r} is over capacity ({reason})"
        )
