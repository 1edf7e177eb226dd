"""The server's state: loading and readiness, draining, starting generations.

One `ServerState` lives on `app.state` for the life of the app. A request is first admitted
(now, after a bounded wait, or refused: admission_queue.py), then becomes a `Generation`
(generation.py).

Draining (the operator's scale-in, or the end of a shutdown) turns readiness false and refuses new
requests with 503 while admitted ones finish; an operator can cancel it. A shutdown (SIGTERM)
turns readiness false first and keeps serving through a grace delay, while load balancers and
routers stop sending, and only then drains; it cannot be cancelled.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypeAlias

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.outputs import EngineStats
from kvscale_engine.engine.tokenizer import Tokenizer
from kvscale_engine.sampling_params import SamplingParams
from kvscale_engine.server.admission_queue import AdmissionQueue, Admitted, KvPool, Refused
from kvscale_engine.server.config import ServerConfig
from kvscale_engine.server.engine_process import EngineProcess
from kvscale_engine.server.engine_runner import EngineRunner, Item
from kvscale_engine.server.engine_thread import EngineThread
from kvscale_engine.server.generation import Generation, Track
from kvscale_engine.server.metrics import EngineMetrics, StatsSnapshot
from kvscale_engine.server.protocol import new_id

if TYPE_CHECKING:  # the server's process never imports torch: the engine runs in a child
    from kvscale_engine.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)


Phase = Literal["loading", "ready", "failed"]
# a config runs the engine in a child process; an engine (or a factory) runs it on a thread here
EngineSource: TypeAlias = "EngineConfig | LLMEngine | Callable[[], LLMEngine]"


def freeze_heap() -> None:
    """Put what is alive once the engine is loaded and warm (the server's modules; torch and the
    model too when the engine runs on a thread here: some 200k objects) out of the collector's
    reach, as vLLM's engine core and API server do (an engine process freezes its own heap once
    loaded): a full collection then walks only what serving allocated since, where it walked
    the whole heap each time (115 ms at 260k objects under 128 requests in flight on a 2-core
    AMD EPYC, a stall for every running request; 11 ms frozen). `ServerState.close` unfreezes."""
    gc.collect()
    gc.freeze()


class ServerState:
    def __init__(self, config: ServerConfig, metrics: EngineMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.phase: Phase = "loading"
        self._runner: EngineRunner | None = None
        self._queue: AdmissionQueue | None = None
        self._counting = False  # engine counters before and during warm-up are not exported
        self.block_size = 1
        self.num_kv_blocks = 0
        self.draining = False  # refusing new requests (POST /drain, or the end of a shutdown)
        self.stopping = False  # SIGTERM received: readiness stays false for good

    # lifecycle

    async def load(self, source: EngineSource) -> None:
        """Build (or adopt) the engine, size admission from its KV budget, warm up, go ready."""
        try:
            self._runner = await self._runner_for(source)
            stats = await self._runner.start()
            self.block_size, self.num_kv_blocks = stats.block_size, stats.num_total_blocks
            pool = KvPool(self.num_kv_blocks, self.block_size, self.config.max_num_seqs)
            self._queue = AdmissionQueue.for_server(self.config, pool, self.metrics)
            self._queue.controller.draining = self.draining  # a drain asked while loading holds
            self.metrics.set_cache_info(self._cache_info(stats))
            self._on_stats(stats)
            if self.config.warmup:
                await self._warm_up()
            self._counting = True
            self._on_stats(await self.runner.stats())
            freeze_heap()
        except Exception:
            log.exception("Engine failed to load")
            self.phase = "failed"
            raise
        if self.phase == "loading":
            self.phase = "ready"
            self.metrics.set_ready(True)
            log.info("Engine became ready: %s", self.config.served_model_name)

    async def _runner_for(self, source: EngineSource) -> EngineRunner:
        if isinstance(source, EngineConfig):
            return EngineProcess(source, self._on_stats)
        engine = await asyncio.to_thread(source) if callable(source) else source
        return EngineThread(engine, self._on_stats)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.stop()
        gc.unfreeze()  # what load froze is the collector's again (a process may load another)

    def start_draining(self) -> None:
        """Readiness false, new requests refused with 503; admitted and queued ones finish."""
        self.draining = True
        self.metrics.set_ready(False)
        if self._queue is not None:
            self._queue.controller.start_draining()

    def stop_draining(self) -> bool:
        """Cancel a drain (an aborted scale-in); False when shutting down, which is final."""
        if self.stopping:
            return False
        self.draining = False
        if self._queue is not None:
            self._queue.controller.stop_draining()
        self.metrics.set_ready(self.ready)
        return True

    def begin_shutdown(self) -> None:
        """SIGTERM: readiness false at once; requests are still served until the drain starts."""
        self.stopping = True
        self.metrics.set_ready(False)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is admitted or queued; True when none is left in time."""
        return self._queue is None or await self._queue.wait_idle(timeout_s)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for admitted and queued ones; True when none are left."""
        self.start_draining()
        return await self.wait_idle(timeout_s)

    def drain_status(self) -> dict[str, object]:
        queued = self._queue.queued if self._queue is not None else 0
        return {
            "draining": self.draining,
            "in_flight": self.active,  # admitted or queued, not finished
            "queued": queued,
            "drained": self.draining and self.active == 0,
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
        return self.phase != "failed" and (self._runner is None or self._runner.error is None)

    @property
    def active(self) -> int:
        return self._queue.active if self._queue is not None else 0

    @property
    def runner(self) -> EngineRunner:
        assert self._runner is not None, "engine not loaded"
        return self._runner

    @property
    def tokenizer(self) -> Tokenizer:
        return self.runner.tokenizer

    @property
    def queue(self) -> AdmissionQueue:
        assert self._queue is not None, "engine not loaded"
        return self._queue

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
        return await self.queue.admit(class_name, kv_tokens, arrival)

    # generation

    def generate(
        self,
        admitted: Admitted,
        prompt_token_ids: list[int],
        params: list[SamplingParams],
    ) -> Generation:
        """Hand an admitted request to the engine; on any failure its slot is given back."""
        stream: asyncio.Queue[Item] = asyncio.Queue()
        release = self.queue.release
        try:
            runner = self.runner
            gen = Generation(runner, self.metrics, release, admitted, len(prompt_token_ids), stream)
        except BaseException:
            release(admitted)
            raise
        base = new_id("req")
        try:
            for index, p in enumerate(params):
                request_id = f"{base}-{index}"
                gen.tracks[request_id] = Track(index)
                cls = admitted.traffic_class
                runner.add(
                    request_id,
                    prompt_token_ids,
                    p,
                    self.queue.controller.priority_of(cls),
                    admitted.arrival,
                    stream=stream,
                    traffic_class=cls.name,
                    preemptible=cls.deferrable,
                )
        except BaseException:
            gen.close()  # aborts the choices already added and releases the slot
            raise
        return gen

    def refresh_load_metrics(self) -> None:
        if self._queue is not None:
            self._queue.refresh_load_metrics()

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
                preemptions_by_class=stats.preemptions_by_class,
                waiting_by_class=stats.waiting_by_class,
                prefix_cache_queries=stats.prefix_cache_queries,
                prefix_cache_hits=stats.prefix_cache_hits,
                prompt_tokens=stats.prompt_tokens,
                generation_tokens=stats.generation_tokens,
            )
        )

    def _cache_info(self, stats: EngineStats) -> dict[str, str]:
        engine_cfg = self.runner.config
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
        return self.runner.vocab_size

    def fits_kv_pool(self, num_tokens: int) -> bool:
        """Whether a request that grows to num_tokens could ever hold its KV blocks."""
        return -(-num_tokens // self.block_size) <= self.num_kv_blocks

    async def _warm_up(self) -> None:
        """One short generation, so the first user request pays no start-up cost.

        It bypasses Generation so that it leaves no trace in the request metrics.
        """
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        stream = self.runner.add(new_id("warmup"), [1, 2, 3, 4], params, 0, time.monotonic())
        while True:
            item = await stream.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                return
