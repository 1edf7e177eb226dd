"""SIGTERM on a live router: /ready turns false at once, a client's kept-alive connection gets one
more answer, marked `Connection: close`, and the router exits cleanly after its grace delay.

This is what a router roll looks like from a client whose pool holds a connection to the old
router: instead of the connection being closed under its next request (an `APIConnectionError`
in the openai client), the answer tells it to reconnect, through the Service, to another router.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from router_fixtures import live_router
from server_fixtures import raw_get

from kvscale_cluster.wait import wait_for

GRACE_S = 4.0


def _ready(url: str) -> int:
    return httpx.get(f"{url}/ready", timeout=5).status_code


def test_sigterm_closes_kept_alive_connections_then_exits(tmp_path: Path) -> None:
    grace = ("--shutdown-grace-seconds", str(GRACE_S))
    with live_router({"a": "http://127.0.0.1:9"}, tmp_path, *grace) as router:
        parts = urlsplit(router.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            status, headers = raw_get(sock, "/health")
            assert status.endswith("200 OK") and headers.get("connection") != "close", headers
            router.process.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            wait_for(lambda: _ready(router.url) == 503, 10, "/ready to answer 503")
            assert httpx.get(f"{router.url}/ready", timeout=5).json()["stopping"] is True
            # the pooled connection still gets its answer, told to reconnect elsewhere
            status, headers = raw_get(sock, "/health")
            assert status.endswith("200 OK") and headers["connection"] == "close", headers
            sock.settimeout(10)
            assert sock.recv(1) == b"", "the router kept the connection open after `close`"
        # uvicorn re-raises the SIGTERM it caught once it has shut down
        assert router.process.wait(timeout=GRACE_S + 20) in (0, -15), router.log()
        assert "Application shutdown complete" in router.log()
        assert time.monotonic() - sent >= GRACE_S - 0.5  # it served through the grace delay
        assert "Received SIGTERM" in router.log()
