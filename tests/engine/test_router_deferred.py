"""Deferrable traffic through the router to a real engine, with the official `openai` client.

A deferred request completes (streamed or not) once spare room or its deadline releases it; a
full deferred queue answers 429 with Retry-After; an unmeetable deadline is refused with an error
that says so; a client that leaves while queued leaves nothing behind; and interactive requests
are not slowed by a deferred backlog.
"""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from router_fixtures import LiveRouter, live_router
from server_fixtures import MODEL, LiveServer, live_server

from kvscale_cluster.wait import wait_for

CLASSES = json.dumps([
    {"name": "chat", "priority": 10},
    {"name": "batch", "maxQueue": 32, "deadlineSeconds": 3600},
    {"name": "small", "maxQueue": 1, "deadlineSeconds": 3600},
    {"name": "soon", "deadlineSeconds": 4},
])  # fmt: skip
BATCH = {"x-kvscale-class": "batch"}


@pytest.fixture(scope="module")
def engine(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(llama_dir, tmp_path_factory.mktemp("engine"), "--max-model-len", "512") as e:
        yield e


def client(router: LiveRouter, cls: str | None = None) -> openai.OpenAI:
    headers = {"x-kvscale-class": cls} if cls else None
    return openai.OpenAI(base_url=router.api, api_key="unused", max_retries=0, timeout=600,
                         default_headers=headers)  # fmt: skip


def router_args(*extra: str) -> tuple[str, ...]:
    return ("--traffic-classes", CLASSES, "--deferred-margin-seconds", "0", *extra)


def queued(router: LiveRouter, cls: str) -> float:
    return router.metric("kvscale_router_deferred_queue_requests", traffic_class=cls)


def publish(router: LiveRouter, budgets: dict[str, float]) -> None:
    """Publish a token budget per replica, as the operator may, without waiting."""
    body = {"weights": {n: 1.0 for n in budgets}, "tokenBudgets": budgets}
    router.weights_path.write_text(json.dumps(body))
    router.process.send_signal(signal.SIGHUP)


def test_a_deferred_request_completes_streamed_or_not(engine: LiveServer, tmp_path: Path) -> None:
    with live_router({"a": engine.url}, tmp_path, *router_args()) as router:
        api = client(router, "batch")
        whole = api.completions.create(model=MODEL, prompt="Deferred work", max_tokens=8,
                                       temperature=0, extra_body={"ignore_eos": True})  # fmt: skip
        assert whole.choices[0].finish_reason == "length" and whole.usage is not None
        stream = api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Deferred chat"}], max_tokens=8,
            temperature=0, stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        released = router.metric("kvscale_router_deferred_released_total", traffic_class="batch",
                                 reason="spare")  # fmt: skip
        assert released == 2
        assert router.metric(
            "kvscale_router_deferred_completed_total", traffic_class="batch", outcome="met"
        )  # fmt: skip == 2
        assert router.metric("kvscale_router_deferred_valley_tokens_total",
                             traffic_class="batch") > 0  # fmt: skip
        # the decode rate was learned from them, away from the 10 tokens/s prior
        rate = router.metric("kvscale_router_deferred_decode_rate_tokens_per_second", replica="a")
        assert rate > 0 and rate != 10.0


def test_a_deadline_releases_a_request_without_spare_room(
    engine: LiveServer, tmp_path: Path
) -> None:
    args = router_args("--deferred-spare-tokens", "0")  # never spare: only the deadline helps
    with live_router({"a": engine.url}, tmp_path, *args) as router:
        start = time.monotonic()
        # 8 tokens at the 10/s prior, twice over: it must go by 4 - 1.6 = 2.4 s after arrival
        done = client(router, "soon").completions.create(model=MODEL, prompt="Due soon",
                                                         max_tokens=8)  # fmt: skip
        assert done.choices[0].text is not None
        assert 2.0 <= time.monotonic() - start < 4.0
        assert router.metric("kvscale_router_deferred_released_total", traffic_class="soon",
                             reason="deadline") == 1  # fmt: skip
        assert router.metric("kvscale_router_deferred_deadline_missed_total",
                             traffic_class="soon", reason="late") == 0  # fmt: skip


def test_a_full_queue_is_429_and_a_leaving_client_leaves_nothing_queued(
    engine: LiveServer, tmp_path: Path
) -> None:
    args = router_args("--deferred-spare-tokens", "0")
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    small = {"x-kvscale-class": "small"}
    with (
        live_router({"a": engine.url}, tmp_path, *args) as router,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        # the client gives up after 3 s, while its request is still queued
        first = pool.submit(httpx.post, f"{router.api}/completions", json=body, headers=small,
                            timeout=3)  # fmt: skip
        wait_for(lambda: queued(router, "small") == 1, 30, "one queued deferred request")
        with pytest.raises(openai.RateLimitError) as full:
            client(router, "small").completions.create(model=MODEL, prompt="x", max_tokens=4)
        assert full.value.body["code"] == "queue_full"  # type: ignore[index]
        assert "queued" in full.value.body["message"]  # type: ignore[index]
        assert 1 <= int(full.value.response.headers["retry-after"]) <= 60
        with pytest.raises(httpx.ReadTimeout):
            first.result(timeout=30)
        wait_for(lambda: queued(router, "small") == 0, 30, "the leaving client's request to go")
        assert router.metric("kvscale_router_deferred_released_total", traffic_class="small",
                             reason="spare") == 0  # fmt: skip


def test_an_unmeetable_deadline_gets_an_error_that_says_so(
    engine: LiveServer, tmp_path: Path
) -> None:
    with live_router({"a": engine.url}, tmp_path, *router_args()) as router:
        # 200 tokens at the 10 tokens/s prior take 20 s; the class's deadline is 4 s
        with pytest.raises(openai.InternalServerError) as refused:
            client(router, "soon").completions.create(model=MODEL, prompt="x", max_tokens=200)
        assert refused.value.status_code == 503
        error = refused.value.body
        assert error["code"] == "deadline_unmeetable"  # type: ignore[index]
        assert "cannot be met" in error["message"]  # type: ignore[index]
        assert router.metric("kvscale_router_deferred_deadline_missed_total",
                             traffic_class="soon", reason="refused") == 1  # fmt: skip


def test_interactive_requests_are_not_delayed_by_a_deferred_backlog(
    engine: LiveServer, tmp_path: Path
) -> None:
    args = router_args("--deferred-spare-tokens", "0")  # the backlog stays queued until budgeted
    n = 16
    with (
        live_router({"a": engine.url}, tmp_path, *args) as router,
        concurrent.futures.ThreadPoolExecutor(n) as pool,
    ):
        chat = client(router)

        def interactive() -> float:
            start = time.monotonic()
            chat.completions.create(model=MODEL, prompt="Quick question", max_tokens=4)
            return time.monotonic() - start

        quiet = min(interactive() for _ in range(3))
        backlog = [
            pool.submit(client(router, "batch").completions.create, model=MODEL,
                        prompt=f"Report {i}", max_tokens=32, extra_body={"ignore_eos": True})
            for i in range(n)
        ]  # fmt: skip
        wait_for(lambda: queued(router, "batch") == n, 30, "the backlog to queue")
        busy = [interactive() for _ in range(5)]
        assert max(busy) < 3 * quiet + 0.5, (quiet, busy)
        assert queued(router, "batch") == n  # none overtook: no spare room was published
        publish(router, {"a": 4096.0})  # the operator publishes room: the backlog drains
        for future in backlog:
            assert future.result(timeout=300).choices[0].finish_reason == "length"
        assert queued(router, "batch") == 0
        assert router.metric(
            "kvscale_router_deferred_completed_total", traffic_class="batch", outcome="met"
        )  # fmt: skip == n
