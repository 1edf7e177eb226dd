"""SIGTERM and the admin drain: readiness goes false, accepted work completes, a drain is undone."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
from server_fixtures import MODEL, LiveServer, live_server, wait_for

LONG = {"model": MODEL, "prompt": "Drain me", "max_tokens": 400, "ignore_eos": True}
SHORT = {"model": MODEL, "prompt": "Still here?", "max_tokens": 2}


class _Stream(threading.Thread):
    """One streaming request on its own thread; records when it was accepted and how it ended."""

    def __init__(self, api: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.max_tokens = max_tokens
        self.accepted = threading.Event()
        self.chunks = 0
        self.done = False
        self.finish_reason: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            body = {**LONG, "stream": True, "max_tokens": self.max_tokens}
            with httpx.stream("POST", f"{self.api}/completions", json=body, timeout=300) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: {"):
                        self.chunks += 1
                        self.accepted.set()
                        if '"finish_reason":"' in line:
                            self.finish_reason = line.split('"finish_reason":"')[1].split('"')[0]
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.accepted.set()


def _start_streams(server: LiveServer, count: int, max_tokens: int = 400) -> list[_Stream]:
    streams = [_Stream(server.api, max_tokens) for _ in range(count)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.accepted.wait(60), "request was not accepted"
    return streams


def _not_ready(server: LiveServer) -> bool:
    try:
        return httpx.get(f"{server.url}/ready", timeout=5).status_code == 503
    except httpx.TransportError:
        return False


def _assert_all_completed(streams: list[_Stream]) -> None:
    for s in streams:
        s.join(300)
        assert s.error is None, s.error
        assert s.done and s.finish_reason == "length"


def _completion(server: LiveServer, body: dict[str, object] = SHORT) -> httpx.Response:
    return httpx.post(f"{server.api}/completions", json=body, timeout=60)


def test_sigterm_serves_through_the_grace_delay_then_drains(
    llama_dir: Path, tmp_path: Path
) -> None:
    args = (
        "--drain-timeout", "300", "--shutdown-grace", "8", "--max-concurrency", "16",
        "--max-model-len", "4096", "--num-kv-blocks", "512",
    )  # fmt: skip
    with live_server(llama_dir, tmp_path, *args) as server:
        streams = _start_streams(server, 2, max_tokens=3000)  # still running after the grace
        server.sigterm()
        wait_for(lambda: _not_ready(server), 30, "readiness to go false")
        # endpoints and routers have not caught up yet: what still arrives is served
        during_grace = _completion(server)
        assert during_grace.status_code == 200, during_grace.text
        assert httpx.get(f"{server.url}/ready").json()["phase"] == "stopping"
        undo = httpx.post(f"{server.admin_url}/undrain", timeout=10)
        assert undo.status_code == 409  # a shutdown cannot be cancelled

        # after the grace delay: refused while the accepted streams run to their end — or, where
        # they already ended (a fast machine), the drained server is gone: nothing new is served
        def refused() -> httpx.Response | str | None:
            try:
                answer = _completion(server)
            except httpx.ConnectError:
                return "exited" if server.process.poll() is not None else None
            return answer if answer.status_code == 503 else None

        late = wait_for(refused, 60, "new requests to be refused")
        if isinstance(late, httpx.Response):
            assert late.json()["error"]["code"] == "draining" and "retry-after" in late.headers
        _assert_all_completed(streams)
        assert server.process.wait(timeout=60) in (0, -15), server.log()
        assert "Drain finished" in server.log()


def test_drain_is_post_only_on_the_admin_port_and_can_be_undone(
    llama_dir: Path, tmp_path: Path
) -> None:
    with live_server(llama_dir, tmp_path) as server:
        for method in ("GET", "POST"):  # the API port (the one the Service exposes) has no drain
            assert httpx.request(method, f"{server.url}/drain", timeout=10).status_code == 404
        assert httpx.post(f"{server.url}/undrain", timeout=10).status_code == 404
        status = httpx.get(f"{server.admin_url}/drain", timeout=10).json()
        assert status == {
            "draining": False, "in_flight": 0, "queued": 0, "drained": False, "phase": "ready",
        }  # fmt: skip

        streams = _start_streams(server, 4)
        started = httpx.post(f"{server.admin_url}/drain", timeout=30)
        assert started.status_code == 200
        assert started.json()["draining"] is True and started.json()["in_flight"] >= 1
        assert started.json()["drained"] is False  # it answered at once, work still running
        assert httpx.get(f"{server.url}/ready").status_code == 503
        refused = _completion(server)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        again = httpx.post(f"{server.admin_url}/drain?wait=120", timeout=150)  # idempotent
        assert again.json() == {
            "draining": True, "in_flight": 0, "queued": 0, "drained": True, "phase": "draining",
        }  # fmt: skip
        _assert_all_completed(streams)
        assert httpx.get(f"{server.url}/health").status_code == 200

        undone = httpx.post(f"{server.admin_url}/undrain", timeout=10)
        assert undone.status_code == 200 and undone.json()["draining"] is False
        assert httpx.get(f"{server.url}/ready").status_code == 200
        assert _completion(server).status_code == 200
