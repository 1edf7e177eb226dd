"""Idle keep-alive connections outlive the clients' own idle timeout, on the engine and the router.

A server that closes an idle connection no later than its client reuses it races the client: a
request sent as the close crosses it fails before the server reads it ("Server disconnected";
the openai client's `APIConnectionError`), which no retry policy of the server can catch. httpx,
under the openai client, reuses a connection for 5 s, uvicorn's default keep-alive timeout. The
test holds a connection idle past both, then checks it is still open and still serves.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from router_fixtures import live_router
from server_fixtures import live_server, raw_get

IDLE_S = 6.5  # past uvicorn's default (5 s) and httpx's keep-alive expiry (5 s)


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def _assert_idle_connection_kept(url: str, path: str) -> None:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        assert raw_get(sock, path)[0].endswith("200 OK")
        time.sleep(IDLE_S)
        assert not _closed_by_peer(sock), f"the server closed a connection idle for {IDLE_S} s"
        assert raw_get(sock, path)[0].endswith("200 OK")


def test_engine_keeps_idle_connections_longer_than_clients(llama_dir: Path, tmp_path: Path) -> None:
    with live_server(llama_dir, tmp_path) as server:
        _assert_idle_connection_kept(server.url, "/health")


def test_router_keeps_idle_connections_longer_than_clients(tmp_path: Path) -> None:
    with live_router({"a": "http://127.0.0.1:9"}, tmp_path) as router:
        _assert_idle_connection_kept(router.url, "/health")


def test_a_short_keep_alive_is_still_honoured(tmp_path: Path) -> None:
    """The flag is the one uvicorn uses: set below the idle time, the router does close."""
    with live_router({"a": "http://127.0.0.1:9"}, tmp_path, "--keep-alive-seconds", "1") as router:
        parts = urlsplit(router.url)
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            assert raw_get(sock, "/health")[0].endswith("200 OK")
            time.sleep(3)
            assert _closed_by_peer(sock)
