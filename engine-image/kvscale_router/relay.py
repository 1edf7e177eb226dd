"""Relaying one upstream response to the client, chunk by chunk, as it arrives.

Nothing is buffered: each chunk the replica sends is written to the client at once. A client
that disconnects cancels the relay, which closes the upstream connection, and the replica aborts
the request and frees its KV blocks. A replica that fails mid-stream is reported in-band (the
status line is already sent), as OpenAI does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import aiohttp
import anyio
from starlette.types import Receive, Scope, Send

from kvscale_router.protocol import sse_error

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "date", "server"}
)  # fmt: skip


def forwarded_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


class Relay:
    """An ASGI response streaming `upstream` through; `done(outcome)` runs exactly once."""

    def __init__(
        self,
        upstream: aiohttp.ClientResponse,
        done: Callable[[str], None],
        first_byte: Callable[[float], None],
        observe: Callable[[bytes], None] | None = None,  # sees every chunk relayed
    ) -> None:
        self.upstream = upstream
        self.done = done
        self.first_byte = first_byte
        self.observe = observe
        self.outcome = "client_disconnected"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(k.encode("latin-1"), v.encode("latin-1"))
                   for k, v in forwarded_headers(self.upstream.headers.items())]  # fmt: skip
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._watch, receive, tasks.cancel_scope)
                await send({"type": "http.response.start", "status": self.upstream.status,
                            "headers": headers})  # fmt: skip
                await self._pump(send)
                tasks.cancel_scope.cancel()
        except OSError:  # the client went away while we wrote (ASGI 2.4 servers)
            self.outcome = "client_disconnected"
        finally:
            if self.outcome == "ok":
                self.upstream.release()  # the connection goes back to the pool
            else:
                self.upstream.close()  # the replica sees the disconnect and aborts
            self.done(self.outcome)

    async def _pump(self, send: Send) -> None:
        first = True
        try:
            async for chunk in self.upstream.content.iter_any():
                arrived = time.perf_counter()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                if first:
                    self.first_byte(time.perf_counter() - arrived)
                    first = False
                if self.observe is not None:
                    self.observe(chunk)
            self.outcome = "ok"
        except (aiohttp.ClientError, TimeoutError) as exc:
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
