"""The server's state: loading and readiness, admission, draining, starting generations.

One `ServerState` lives on `app.state` for the life of the app. A request is first admitted
(now, after a bounded wait, or refused), then becomes a `Generation` (generation.py).

Draining (the operator's scale-in, or the end of a shutdown) turns readiness false and refuses new
requests with 503 while admitted ones finish; an operator can cancel it. A shutdown (SIGTERM)
turns readiness false first and keeps serving through a grace delay, while load balancers and
routers stop sending, and only then drains; it cannot be cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Literal

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.outputs import EngineStats
from kvscale_engine.engine.tokenizer import Tokenizer
from kvscale_engine.sampling_params import SamplingParams
from kvscale_engine.server.admission import (
    AdmissionController,
    KvFootprint,
    TrafficClass,
    derive_concurrency_limit,
)
from kvscale_engine.server.config import ServerConfig
from kvscale_engine.server.engine_thread import EngineThread, Item
from kvscale_engine.server.generation import Admitted, Generation, Track
from kvscale_engine.server.metrics import EngineMetrics, StatsSnapshot
from kvscale_engine.server.protocol import new_id

log = logging.getLogger(__name__)
Phase = Literal["loading", "ready", "failed"]
EngineSource = LLMEngine | Callable[[], LLMEngine]


class Refused(Exception):
    """The request was not admitted: 429 (overload) or 503 (loading, draining)."""

    def __init__(self, status: int, reason: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


class ServerState:
    def __init__(self, config: ServerConfig, metrics: EngineMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.phase: Phase = "loading"
        self._engine_thread: EngineThread | None = None
        self._admission: AdmissionController | None = None
        self._tickets = itertools.count()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._counting = False  # engine counters before and during warm-up are not exported
        self._footprint: KvFootprint | None = None  # set when the limit follows request lengths
        self.block_size = 1
        self.num_kv_blocks = 0
        self.draining = False  # refusing new requests (POST /drain, or the end of a shutdown)
        self.stopping = False  # SIGTERM received: readiness stays false for good

    # lifecycle

    async def load(self, source: EngineSource) -> None:
        """Build (or adopt) the engine, size admission from its KV budget, warm up, go ready."""
        try:
            engine = await asyncio.to_thread(source) if callable(source) else source
            self._engine_thread = EngineThread(engine, self._on_stats)
            self._engine_thread.start()
            stats = await self._engine_thread.call(engine.stats)
            self.block_size, self.num_kv_blocks = stats.block_size, stats.num_total_blocks
            self._admission = self._build_admission(stats)
            self._admission.draining = self.draining  # a drain asked for while loading holds
            self.metrics.set_cache_info(self._cache_info(stats))
            self._on_stats(stats)
            if self.config.warmup:
                await self._warm_up()
            self._counting = True
            self._on_stats(await self._engine_thread.call(engine.stats))
        except Exception:
            log.exception("Engine failed to load")
            self.phase = "failed"
            raise
        if self.phase == "loading":
            self.phase = "ready"
            self.metrics.set_ready(True)
            log.info("Engine became ready: %s", self.config.served_model_name)

    async def close(self) -> None:
        if self._engine_thread is not None:
            await self._engine_thread.stop()

    def start_draining(self) -> None:
        """Readiness false, new requests refused with 503; admitted and queued ones finish."""
        self.draining = True
        self.metrics.set_ready(False)
        if self._admission is not None:
            self._admission.start_draining()

    def stop_draining(self) -> bool:
        """Cancel a drain (an aborted scale-in); False when shutting down, which is final."""
        if self.stopping:
            return False
        self.draining = False
        if self._admission is not None:
            self._admission.stop_draining()
        self.metrics.set_ready(self.ready)
        return True

    def begin_shutdown(self) -> None:
        """SIGTERM: readiness false at once; requests are still served until the drain starts."""
        self.stopping = True
        self.metrics.set_ready(False)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is admitted or queued; True when none is left in time."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for admitted and queued ones; True when none are left."""
        self.start_draining()
        return await self.wait_idle(timeout_s)

    def drain_status(self) -> dict[str, object]:
        queued = self._admission.queued if self._admission is not None else 0
        return {
            "draining": self.draining,
            "in_flight": self._active,  # admitted or queued, not finished
            "queued": queued,
            "drained": self.draining and self._active == 0,
            "phase": self.status,
        }

    @property
    def status(self) -> str:
        """The phase as probes report it: loading, ready, draining, stopping or failed."""
        if self.phase == "failed" or not self.healthy:
            return "failed"
        if self.stopping:
            return "stopping"
        if self.draining:
            return "draining"
        return self.phase

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def healthy(self) -> bool:
        return self.phase != "failed" and (
            self._engine_thread is None or self._engine_thread.error is None
        )

    @property
    def active(self) -> int:
        return self._active

    @property
    def engine_thread(self) -> EngineThread:
        assert self._engine_thread is not None, "engine not loaded"
        return self._engine_thread

    @property
    def tokenizer(self) -> Tokenizer:
        tokenizer: Tokenizer = self.engine_thread.engine.tokenizer
        return tokenizer

    @property
    def admission(self) -> AdmissionController:
        assert self._admission is not None, "engine not loaded"
        return self._admission

    # admission

    def require_loaded(self) -> None:
        """Refuse with 503 until the engine is loaded (and for good if it failed)."""
        if self.phase == "loading":
            raise Refused(503, "not_ready", 5.0, "the model is not loaded yet")
        if self.phase == "failed" or not self.healthy:
            raise Refused(503, "engine_failed", 30.0, "the engine failed; see /health")

    async def admit(self, class_name: str | None, kv_tokens: int) -> Admitted:
        """Admit (or queue, or refuse) a request that may grow to `kv_tokens` KV tokens."""
        arrival = time.monotonic()
        self.require_loaded()
        admission = self.admission
        cls = admission.resolve(class_name)
        if self._footprint is not None:
            self._footprint.asked(kv_tokens)
            self._retune(arrival)
        ticket = next(self._tickets)
        verdict = admission.offer(ticket, cls, arrival)
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
        self._wake(self.admission.release(admitted.ticket, now))
        if self._footprint is not None and admitted.used_tokens is not None:
            self._footprint.used(admitted.used_tokens)
            self._retune(now)
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
        limit = derive_concurrency_limit(
            self.num_kv_blocks,
            self.block_size,
            self._footprint.expected_tokens,
            self.config.max_num_seqs,
        )
        if limit != self.admission.limit:
            self._wake(self.admission.set_limit(limit, now))

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
        if self.admission.cancel(admitted.ticket, timed_out_at=now):
            admitted.released = True
            self._active -= 1
            if self._active == 0:
                self._idle.set()
        else:  # it was admitted in the same instant
            self.release(admitted)

    def _refuse(self, reason: str, cls: TrafficClass, retry_after_s: float) -> Refused:
        self.metrics.observe_rejection(reason, cls.name)
        if reason == "draining":
            return Refused(503, reason, retry_after_s, "the server is draining")
        return Refused(
            429, reason, retry_after_s, f"traffic class {cls.name!r} is over capacity ({reason})"
        )

    # generation

    def generate(
        self,
        admitted: Admitted,
        prompt_token_ids: list[int],
        params: list[SamplingParams],
    ) -> Generation:
        """Hand an admitted request to the engine; on any failure its slot is given back."""
        stream: asyncio.Queue[Item] = asyncio.Queue()
        try:
            loop = self.engine_thread
            gen = Generation(
                loop, self.metrics, self.release, admitted, len(prompt_token_ids), stream
            )
        except BaseException:
            self.release(admitted)
            raise
        base = new_id("req")
        try:
            for index, p in enumerate(params):
                request_id = f"{base}-{index}"
                gen.tracks[request_id] = Track(index)
                loop.add(
                    request_id,
                    prompt_token_ids,
                    p,
                    admitted.traffic_class.priority,
                    admitted.arrival,
                    stream=stream,
                )
        except BaseException:
            gen.close()  # aborts the choices already added and releases the slot
            raise
        return gen

    def refresh_load_metrics(self) -> None:
        if self._admission is None:
            return
        for name, (queued, in_flight) in self._admission.load().items():
            self.metrics.set_admission_load(name, queued, in_flight)

    def _on_stats(self, stats: EngineStats) -> None:
        observe = self.metrics.observe_stats if self._counting else self.metrics.set_baseline
        observe(
            StatsSnapshot(
                num_running=stats.num_running,
                num_waiting=stats.num_waiting,
                num_total_blocks=stats.num_total_blocks,
                num_free_blocks=stats.num_free_blocks,
                kv_cache_usage=stats.kv_cache_usage,
                num_preemptions=stats.num_preemptions,
                prefix_cache_queries=stats.prefix_cache_queries,
                prefix_cache_hits=stats.prefix_cache_hits,
                prompt_tokens=stats.prompt_tokens,
                generation_tokens=stats.generation_tokens,
            )
        )

    def _build_admission(self, stats: EngineStats) -> AdmissionController:
        cfg = self.config
        if not cfg.admission:
            unlimited = tuple(
                TrafficClass(c.name, c.priority, None, 1 << 30, float("inf"))
                for c in cfg.traffic_classes
            )
            return AdmissionController(unlimited, None)
        if cfg.max_concurrency is not None:
            limit = cfg.max_concurrency
            log.info("Admission limited concurrency to %d requests", limit)
        else:
            self._footprint = KvFootprint(cfg.max_model_len)
            limit = derive_concurrency_limit(
                stats.num_total_blocks,
                stats.block_size,
                self._footprint.expected_tokens,
                cfg.max_num_seqs,
            )
            log.info("Admission starts at %d requests and follows request lengths", limit)
        return AdmissionController(cfg.traffic_classes, limit)

    def _cache_info(self, stats: EngineStats) -> dict[str, str]:
        engine_cfg = self.engine_thread.engine.config
        return {
            "block_size": str(stats.block_size),
            "num_gpu_blocks": str(stats.num_total_blocks),
            "gpu_memory_utilization": str(engine_cfg.memory_fraction),
            "enable_prefix_caching": str(engine_cfg.enable_prefix_caching),
            "cache_dtype": engine_cfg.dtype,
            "max_model_len": str(self.config.max_model_len),
            "max_num_seqs": str(self.config.max_num_seqs),
        }

    @property
    def vocab_size(self) -> int:
        vocab: int = self.engine_thread.engine.model_config.vocab_size
        return vocab

    def fits_kv_pool(self, num_tokens: int) -> bool:
        """Whether a request that grows to num_tokens could ever hold its KV blocks."""
        return -(-num_tokens // self.block_size) <= self.num_kv_blocks

    async def _warm_up(self) -> None:
        """One short generation, so the first user request pays no start-up cost.

        It bypasses Generation so that it leaves no trace in the request metrics.
        """
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        stream = self.engine_thread.add(new_id("warmup"), [1, 2, 3, 4], params, 0, time.monotonic())
        while True:
            item = await stream.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                return
