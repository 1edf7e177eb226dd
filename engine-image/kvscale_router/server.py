"""The router's ASGI app: the OpenAI routes it proxies, /health, /ready and /metrics.

`create_app(config, source)` builds everything in the lifespan (no module-level state): the
replica table, the source task that keeps it current, the picker, admission, the hold and one
pooled HTTP client for the replicas. `app.state.shutdown` is set when the router is to go
(SIGTERM, cli.py): from then /ready answers 503, so the Service stops sending new connections,
and every response closes its connection, so clients holding one open in their pools reconnect,
through the Service, to another router instead of losing a request to the close at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvscale_router import proxy
from kvscale_router.admission import Admission
from kvscale_router.config import RouterConfig
from kvscale_router.hold import Hold
from kvscale_router.metrics import RouterMetrics
from kvscale_router.picker import Picker
from kvscale_router.release import Releaser
from kvscale_router.replicas import ReplicaSource, ReplicaTable

log = logging.getLogger(__name__)


def build_router(config: RouterConfig, client: aiohttp.ClientSession) -> proxy.Router:
    metrics = RouterMetrics()
    table = ReplicaTable(config.warmup_s)
    picker = Picker(config.policy, config.epsilon, config.index_capacity)

    hold = Hold(table, metrics, config.max_pending, config.pending_timeout_s)
    admission = Admission(config.traffic_classes)
    releaser = Releaser(config, table, picker, admission, hold, metrics)

    def forget(gone: set[str]) -> None:
        for name in gone:
            picker.removed(name)
        releaser.forget(gone)

    table.on_removed(forget)
    return proxy.Router(config, table, picker, admission, hold, metrics, client, releaser)


async def _follow(source: ReplicaSource, router: proxy.Router) -> None:
    """Run the source for the app's lifetime; a crash is logged and the source restarted."""
    while True:
        try:
            await source.run(router.table)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("Replica source %s failed; restarting it", source.description)
            await asyncio.sleep(1.0)


@dataclass
class Shutdown:
    """Whether the router is on its way out (SIGTERM received)."""

    started: bool = False


class CloseWhenStopping:
    """ASGI middleware: once shutdown has started, every response says `Connection: close`."""

    def __init__(self, app: ASGIApp, shutdown: Shutdown) -> None:
        self.app, self.shutdown = app, shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and self.shutdown.started:
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


def create_app(config: RouterConfig, source: ReplicaSource) -> Starlette:
    shutdown = Shutdown()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # aiohttp, not httpx: its connection pool costs several times less CPU per request
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, auto_decompress=False
        ) as client:
            app.state.router = router = build_router(config, client)
            tasks = [
                asyncio.create_task(_follow(source, router)),
                asyncio.create_task(router.releaser.run()),
            ]
            log.info("Router started with %s, policy %s", source.description, config.policy)
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def router_of(request: Request) -> proxy.Router:
        router: proxy.Router = request.app.state.router
        return router

    async def generate(request: Request) -> proxy.Reply:
        return await proxy.generate(router_of(request), request)

    async def models(request: Request) -> Response:
        return await proxy.models(router_of(request), request)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        """Ready once the replicas were listed (with none, requests are held, not refused) and
        until shutdown starts."""
        router = router_of(request)
        synced = router.table.synced
        body = {
            "synced": synced,
            "routable": len(router.table.routable()),
            "stopping": shutdown.started,
        }
        return JSONResponse(body, status_code=200 if synced and not shutdown.started else 503)

    async def metrics(request: Request) -> Response:
        router = router_of(request)
        busy = (name for name, n in router.picker.in_flight.items() if n > 0)
        router.metrics.show_weights(router.table.weights(), busy)
        router.releaser.show(time.monotonic())
        return Response(generate_latest(router.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(CloseWhenStopping, shutdown=shutdown)],
    )
    app.state.shutdown = shutdown
    return app
