"""Relaying one upstream response to the client, chunk by chunk, as it arrives.

Nothing is buffered: each chunk the replica sends is written to the client at once. A client
that disconnects cancels the relay, which closes the upstream connection, and the replica aborts
the request and frees its KV blocks. A replica that fails mid-stream is reported in-band (the
status line is already sent), as OpenAI does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import httpx
from starlette.types import Receive, Scope, Send

from kvscale_router.protocol import sse_error

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "date", "server"}
)  # fmt: skip


def forwarded_headers(headers: httpx.Headers | list[tuple[str, str]]) -> list[tuple[str, str]]:
    items = headers.multi_items() if isinstance(headers, httpx.Headers) else headers
    return [(k, v) for k, v in items if k.lower() not in HOP_BY_HOP]


class Relay:
    """An ASGI response streaming `upstream` through; `done(outcome)` runs exactly once."""

    def __init__(
        self,
        upstream: httpx.Response,
        done: Callable[[str], None],
        first_byte: Callable[[float], None],
    ) -> None:
        self.upstream = upstream
        self.done = done
        self.first_byte = first_byte
        self.outcome = "client_disconnected"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1"))
                   for k, v in forwarded_headers(self.upstream.headers)]  # fmt: skip
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._watch, receive, tasks.cancel_scope)
                await send({"type": "http.response.start", "status": self.upstream.status_code,
                            "headers": headers})  # fmt: skip
                await self._pump(send)
                tasks.cancel_scope.cancel()
        except OSError:  # the client went away while we wrote (ASGI 2.4 servers)
            self.outcome = "client_disconnected"
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
            self.done(self.outcome)

    async def _pump(self, send: Send) -> None:
        first = True
        try:
            async for chunk in self.upstream.aiter_raw():
                arrived = time.perf_counter()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if first:
                    self.first_byte(time.perf_counter() - arrived)
                    first = False
            self.outcome = "ok"
        except httpx.HTTPError as exc:
            self.outcome = "upstream_failed"
            if "text/event-stream" in self.upstream.headers.get("content-type", ""):
                error = sse_error(f"The replica failed mid-stream: {exc!r}")
                await send({"type": "http.response.body", "body": error, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _watch(receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()
