"""Admission control through HTTP: classes from the header, queueing, fast 429 with Retry-After."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import MODEL, LiveServer, live_server, wait_for

CLASSES = [
    {"name": "batch", "priority": 0, "maxQueue": 0},
    {"name": "interactive", "priority": 10, "maxQueue": 1, "maxQueueWaitSeconds": 60},
    {"name": "impatient", "priority": 5, "maxQueue": 4, "maxQueueWaitSeconds": "300ms"},
]
LONG = {"model": MODEL, "prompt": "hold the slot", "max_tokens": 4000, "ignore_eos": True}
SHORT = {"model": MODEL, "prompt": "quick one", "max_tokens": 4}


@pytest.fixture(scope="module")
def server(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    args = (
        "--traffic-classes", json.dumps(CLASSES), "--max-concurrency", "1",
        "--max-model-len", "4096", "--num-kv-blocks", "512",
    )  # fmt: skip
    with live_server(llama_dir, tmp_path_factory.mktemp("admission"), *args) as live:
        yield live


def _post(server: LiveServer, body: dict[str, Any], cls: str | None) -> httpx.Response:
    headers = {"x-kvscale-class": cls} if cls else {}
    return httpx.post(f"{server.api}/completions", json=body, headers=headers, timeout=120)


def _sample(server: LiveServer, name: str, **labels: str) -> float:
    wanted = {"engine": "0", "model_name": MODEL, **labels}
    key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(wanted.items())) + "}"
    return server.metrics()[key]


class _Holder(threading.Thread):
    """Streams a long request and holds its admission slot until release() closes the stream."""

    def __init__(self, server: LiveServer) -> None:
        super().__init__(daemon=True)
        self.server = server
        self._release = threading.Event()

    def run(self) -> None:
        body = {**LONG, "stream": True}
        url = f"{self.server.api}/completions"
        headers = {"x-kvscale-class": "batch"}
        with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as resp:
            for _ in resp.iter_lines():
                if self._release.is_set():
                    return  # closing the stream aborts the request and frees the slot

    def release(self) -> None:
        self._release.set()
        self.join(60)


class _Background(threading.Thread):
    def __init__(self, server: LiveServer, body: dict[str, Any], cls: str | None) -> None:
        super().__init__(daemon=True)
        self.args = (server, body, cls)
        self.response: httpx.Response | None = None

    def run(self) -> None:
        self.response = _post(*self.args)


def _in_flight(server: LiveServer, cls: str) -> bool:
    return _sample(server, "kvscale_engine_admission_in_flight", traffic_class=cls) >= 1


def _queued(server: LiveServer, cls: str) -> bool:
    return _sample(server, "kvscale_engine_admission_queue_depth", traffic_class=cls) >= 1


def test_queue_wait_past_the_deadline_is_refused(server: LiveServer) -> None:
    # first in the module: a few quick requests teach admission that slots free up fast, so it
    # queues the impatient request behind the long one, and that request then times out
    for _ in range(3):
        assert _post(server, SHORT, "impatient").status_code == 200
    holder = _Holder(server)
    holder.start()
    wait_for(lambda: _in_flight(server, "batch"), 30, "the long request to be admitted")
    started = time.monotonic()
    timed_out = _post(server, SHORT, "impatient")
    elapsed = time.monotonic() - started
    assert timed_out.status_code == 429 and timed_out.json()["error"]["code"] == "timeout"
    assert 0.25 <= elapsed < 5.0
    holder.release()
    assert (
        _sample(
            server,
            "kvscale_engine_admission_rejections_total",
            reason="timeout",
            traffic_class="impatient",
        )
        == 1
    )


def test_full_class_is_refused_fast_and_queued_one_runs_later(server: LiveServer) -> None:
    holder = _Holder(server)
    holder.start()
    wait_for(lambda: _in_flight(server, "batch"), 30, "the long request to be admitted")

    started = time.monotonic()
    refused = _post(server, SHORT, "batch")  # batch queues nothing
    elapsed = time.monotonic() - started
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "queue_full"
    assert refused.json()["error"]["type"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert elapsed < 1.0

    waiter = _Background(server, SHORT, "interactive")
    waiter.start()
    wait_for(lambda: _queued(server, "interactive"), 30, "the interactive request to queue")
    # a request in the admission queue waits to be processed, as vLLM counts it (the long one runs)
    interactive = {"traffic_class": "interactive", "deferrable": "false"}
    assert _sample(server, "vllm:num_requests_waiting") == 1
    assert _sample(server, "kvscale_engine_requests_waiting", **interactive) == 1
    second = _post(server, SHORT, "interactive")  # its queue holds one
    assert second.status_code == 429 and second.json()["error"]["code"] == "queue_full"

    holder.release()
    waiter.join(120)
    assert waiter.response is not None and waiter.response.status_code == 200, waiter.response
    assert _sample(server, "vllm:num_requests_waiting") == 0
    assert _sample(server, "kvscale_engine_requests_waiting", **interactive) == 0
    rejected = _sample(
        server,
        "kvscale_engine_admission_rejections_total",
        reason="queue_full",
        traffic_class="batch",
    )
    assert rejected == 1


def test_missing_or_unknown_class_uses_the_default(server: LiveServer) -> None:
    for cls in (None, "no-such-class"):
        assert _post(server, SHORT, cls).status_code == 200
    wait_for(
        lambda: _sample(server, "kvscale_engine_admission_in_flight", traffic_class="batch") == 0,
        30,
        "the slot to be released",
    )


class _Stream(threading.Thread):
    """A streaming request that holds its slot until stop(); records its status code."""

    def __init__(self, server: LiveServer, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.server, self.body = server, body
        self.status: int | None = None
        self._quit = threading.Event()

    def run(self) -> None:
        url = f"{self.server.api}/completions"
        with httpx.stream("POST", url, json={**self.body, "stream": True}, timeout=120) as resp:
            self.status = resp.status_code
            for _ in resp.iter_lines():
                if self._quit.is_set():
                    return

    def stop(self) -> None:
        self._quit.set()
        self.join(60)


def test_default_concurrency_follows_request_lengths_not_max_model_len(
    llama_dir: Path, tmp_path: Path
) -> None:
    # 1,024 blocks of 16 hold 4 requests of max_model_len 4,096: the old default limit. Requests
    # that ask for ~1,000 tokens each fit 16 at a time, so 10 of them all run at once.
    args = ("--max-model-len", "4096", "--num-kv-blocks", "1024")
    with live_server(llama_dir, tmp_path, *args) as server:
        body = {"model": MODEL, "prompt": "hold on", "max_tokens": 1000, "ignore_eos": True}
        streams = [_Stream(server, body) for _ in range(10)]
        for s in streams:
            s.start()
        try:
            wait_for(
                lambda: (
                    _sample(server, "kvscale_engine_admission_in_flight", traffic_class="default")
                    == 10
                ),
                60,
                "all ten requests to be admitted together",
            )
            assert (
                _sample(server, "kvscale_engine_admission_queue_depth", traffic_class="default")
                == 0
            )
        finally:
            for s in streams:
                s.stop()
        assert [s.status for s in streams] == [200] * 10
