"""SIGTERM and /drain: readiness goes false, new work is refused, accepted work completes."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from server_fixtures import MODEL, LiveServer, live_server, wait_for

LONG = {"model": MODEL, "prompt": "Drain me", "max_tokens": 400, "ignore_eos": True}


class _Stream(threading.Thread):
    """One streaming request on its own thread; records when it was accepted and how it ended."""

    def __init__(self, api: str) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.accepted = threading.Event()
        self.chunks = 0
        self.done = False
        self.finish_reason: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            body = {**LONG, "stream": True}
            with httpx.stream("POST", f"{self.api}/completions", json=body, timeout=120) as r:
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


def _start_streams(server: LiveServer, count: int) -> list[_Stream]:
    streams = [_Stream(server.api) for _ in range(count)]
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
        s.join(120)
        assert s.error is None, s.error
        assert s.done and s.finish_reason == "length"


def test_sigterm_finishes_every_accepted_request(llama_dir: Path, tmp_path: Path) -> None:
    args = ("--drain-timeout", "60", "--max-concurrency", "16")
    with live_server(llama_dir, tmp_path, *args) as server:
        streams = _start_streams(server, 12)
        server.sigterm()
        wait_for(lambda: _not_ready(server), 30, "readiness to go false")
        late = httpx.post(f"{server.api}/completions", json=LONG, timeout=30)
        assert late.status_code == 503
        assert late.json()["error"]["code"] == "draining" and "retry-after" in late.headers
        _assert_all_completed(streams)
        assert server.process.wait(timeout=60) in (0, -15), server.log()
        assert "Drain finished" in server.log()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_drain_endpoint_waits_for_in_flight_work(
    llama_dir: Path, tmp_path: Path, method: str
) -> None:
    with live_server(llama_dir, tmp_path) as server:
        streams = _start_streams(server, 4)
        assert not any(s.done for s in streams)
        drained = httpx.request(method, f"{server.url}/drain", timeout=120)
        # the server saw no work left when it answered, and every stream ran to its end
        assert drained.status_code == 200 and drained.json() == {
            "drained": True, "in_flight": 0, "phase": "draining",
        }  # fmt: skip
        _assert_all_completed(streams)
        assert httpx.get(f"{server.url}/ready").status_code == 503
        assert httpx.get(f"{server.url}/health").status_code == 200
        refused = httpx.post(f"{server.api}/completions", json=LONG, timeout=30)
        assert refused.status_code == 503
