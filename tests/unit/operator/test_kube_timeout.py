"""Every API call the operator makes has a deadline: a server that accepts the connection and
never answers makes the call fail after one read timeout, it does not hang a reconcile (nor wait
out urllib3's default three retries)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kvscale.kube import TIMEOUT_S, Kube, KubeError, api_client

READ_TIMEOUT_S = 0.5


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """A TCP server that accepts every connection and never sends a byte: (url, connections)."""
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
        yield f"http://{host}:{port}", held
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def _kube(
    url: str, timeout_s: tuple[float, float], kubeconfig: Path, mp: pytest.MonkeyPatch
) -> Kube:
    """The operator's own client (`kvscale.kube.api_client`), from a kubeconfig pointing at url."""
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "silent",
        "clusters": [{"name": "silent", "cluster": {"server": url}}],
        "users": [{"name": "silent", "user": {"token": "t"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "silent"}}],
    }))  # fmt: skip
    mp.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    return Kube(api_client(str(kubeconfig)), timeout_s=timeout_s)


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
    silent_server: tuple[str, list[socket.socket]],
    method: str,
    call: Callable[[Kube], object],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, connections = silent_server
    kube = _kube(url, (READ_TIMEOUT_S, READ_TIMEOUT_S), tmp_path / "kubeconfig", monkeypatch)
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
    # it waited for the answer once, on one connection: a read that timed out is not retried
    assert elapsed >= READ_TIMEOUT_S
    assert len(connections) == 1, f"{method} was sent {len(connections)} times"


def test_a_refused_connection_is_retried_then_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        host, port = closed.getsockname()
    kube = _kube(f"http://{host}:{port}", TIMEOUT_S, tmp_path / "kubeconfig", monkeypatch)
    with pytest.raises(KubeError) as err:
        kube.get("apps/v1", "Deployment", "ns", "chat")
    assert err.value.status == 0 and "refused" in err.value.message.lower(), err.value.message
