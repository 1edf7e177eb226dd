"""Replicas' /metrics over real loopback HTTP, one port each, for the direct-scrape tests.

Each replica's text comes from the engine's own `EngineMetrics` (the code a real replica
serves), so the scraper reads exactly what it would read from a pod. A replica can restart
(fresh counters), answer slowly, answer an error, or serve any other text.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import generate_latest

from kvscale.signals.source import PodAddress
from kvscale_engine.server.metrics import EngineMetrics, FinishedRequest, StatsSnapshot


def engine_metrics() -> EngineMetrics:
    metrics = EngineMetrics("tiny-llama", 512, ["default"])
    metrics.set_baseline(stats(0, 0))
    return metrics


def stats(prompt: int, generation: int, running: int = 0, waiting: int = 0,
          kv: float = 0.0, queries: int = 0, hits: int = 0) -> StatsSnapshot:  # fmt: skip
    return StatsSnapshot(
        num_running=running, num_waiting=waiting, num_total_blocks=256,
        num_free_blocks=int(256 * (1 - kv)), kv_cache_usage=kv, num_preemptions=0,
        prefix_cache_queries=queries, prefix_cache_hits=hits, prompt_tokens=prompt,
        generation_tokens=generation,
    )  # fmt: skip


@dataclass
class Replica:
    name: str
    metrics: EngineMetrics = field(default_factory=engine_metrics)
    text: str | None = None  # served instead of the metrics when set
    status: int = 200
    delay_s: float = 0.0
    port: int = 0

    @property
    def address(self) -> PodAddress:
        return PodAddress(self.name, "127.0.0.1", self.port)

    def restart(self) -> None:
        self.metrics = engine_metrics()

    def finish(self, count: int, ttft_s: float) -> None:
        for _ in range(count):
            self.metrics.observe_first_token(ttft_s)
            self.metrics.observe_inter_token(0.02)
            self.metrics.observe_finished(FinishedRequest("stop", ttft_s + 0.02, 0.0, 10, 2))

    async def handle(self, _: web.Request) -> web.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        body = (
            self.text if self.text is not None else generate_latest(self.metrics.registry).decode()
        )
        return web.Response(text=body, status=self.status)


def closed_port() -> PodAddress:
    """An address nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return PodAddress("gone-0", "127.0.0.1", port)


@asynccontextmanager
async def farm(*names: str) -> AsyncIterator[dict[str, Replica]]:
    replicas = {name: Replica(name) for name in names}
    runners = []
    try:
        for replica in replicas.values():
            app = web.Application()
            app.router.add_get("/metrics", replica.handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
            await runner.setup()
            runners.append(runner)
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            replica.port = sock.getsockname()[1]
            await web.SockSite(runner, sock).start()
        yield replicas
    finally:
        for runner in runners:
            await runner.cleanup()
