"""Every API call the operator makes has a deadline: a server that accepts the connection and
never answers makes the call fail, it does not hang a reconcile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from kvscale.kube import TIMEOUT_S, Kube, KubeError

READ_TIMEOUT_S = 0.5
URLLIB3_ATTEMPTS = {"GET": 4, "PATCH": 1}  # urllib3 retries idempotent requests 3 times


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts every connection and never sends a byte."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    host, port = listener.getsockname()
    try:
        yield f"http://{host}:{port}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def _kube(url: str, timeout_s: tuple[float, float]) -> Kube:
    configuration = client.Configuration(host=url)
    return Kube(client.ApiClient(configuration), timeout_s=timeout_s)


def test_default_timeout_is_set() -> None:
    connect, read = TIMEOUT_S
    assert 0 < connect <= 10 and 0 < read <= 60
    assert Kube(client.ApiClient()).timeout_s == TIMEOUT_S


@pytest.mark.parametrize(
    ("method", "call"),
    [
        ("GET", lambda kube: kube.get("apps/v1", "Deployment", "ns", "chat")),
        ("PATCH", lambda kube: kube.patch_endpoint_status("ns", "chat", {"replicas": 1})),
    ],
)
def test_silent_server_fails_the_call_instead_of_hanging(
    silent_server: str, method: str, call: Callable[[Kube], object]
) -> None:
    kube = _kube(silent_server, (READ_TIMEOUT_S, READ_TIMEOUT_S))
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            call(kube)
        except BaseException as err:  # handed to the test thread
            done.append(err)
        else:
            done.append(None)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)  # far below "forever", far above scheduling delays on a busy machine
    elapsed = time.monotonic() - started
    assert not thread.is_alive(), f"{method} still hangs after {elapsed:.0f} s"
    assert done and isinstance(done[0], KubeError), f"{method}: {done[0]!r}"
    assert done[0].status == 0 and "timed out" in done[0].message.lower(), done[0].message
    # it waited for the answer once per attempt before giving up
    assert elapsed >= URLLIB3_ATTEMPTS[method] * READ_TIMEOUT_S
