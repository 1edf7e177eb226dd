"""The router in front of real engine processes, driven by the official `openai` client.

Streams pass through chunk by chunk, a client that leaves aborts the request in the engine,
errors become OpenAI error bodies, a dead replica is skipped before the first byte, a lone
replica that drops a connection is tried again, weight 0 drains a replica while its in-flight
stream finishes, requests are held while no replica may take them, and the router refuses with
429/503 + Retry-After at its bounds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from router_fixtures import LiveRouter, live_router
from server_fixtures import MODEL, LiveServer, live_server

from kvscale_cluster.ports import free_port
from kvscale_cluster.wait import wait_for

LONG = ("--max-model-len", "2048", "--num-kv-blocks", "1024")  # long streams for in-flight tests
LABELS = 'engine="0",model_name="tiny-llama"'


@pytest.fixture(scope="module")
def engines(
    llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, LiveServer]]:
    tmp = tmp_path_factory.mktemp("engines")
    with live_server(llama_dir, tmp, *LONG) as a, live_server(llama_dir, tmp, *LONG) as b:
        yield {"a": a, "b": b}


def urls(engines: dict[str, LiveServer]) -> dict[str, str]:
    return {name: server.url for name, server in engines.items()}


def client(router: LiveRouter) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.api, api_key="unused", max_retries=0, timeout=120)


def served(server: LiveServer) -> float:
    return float(server.metrics().get(f"vllm:prompt_tokens_total{{{LABELS}}}", 0.0))


def running(server: LiveServer) -> float:
    return float(server.metrics()[f"vllm:num_requests_running{{{LABELS}}}"])


def aborted(server: LiveServer) -> float:
    key = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny-llama"}'
    return float(server.metrics().get(key, 0.0))


def stream_texts(api: openai.OpenAI, max_tokens: int) -> list[str]:
    stream = api.completions.create(
        model=MODEL, prompt="The router relays", max_tokens=max_tokens, temperature=0,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    return [chunk.choices[0].text for chunk in stream]


def test_streams_pass_through_chunk_by_chunk(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    direct = openai.OpenAI(base_url=engines["a"].api, api_key="unused", max_retries=0)
    with live_router({"a": engines["a"].url}, tmp_path) as router:
        # the same chunks, with the same boundaries
        assert stream_texts(client(router), 300) == stream_texts(direct, 300)
        chat = client(router).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert chat.choices[0].message.content is not None and chat.usage is not None
        assert [m.id for m in client(router).models.list()] == [MODEL]
        wait_for(
            lambda: router.metric("kvscale_router_requests_total", replica="a", code="200") == 3,
            30, "three answered requests in the router's metrics",
        )  # fmt: skip
        assert router.metrics()["kvscale_router_added_latency_seconds_count{}"] == 2


def test_the_first_chunk_arrives_while_the_engine_still_generates(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    """Unbuffered: a router that held the answer back would pass its first chunk on only after
    the engine finished; here the engine is still generating 2,000 tokens when it arrives. (An
    invariant, unlike the spread of arrival times, which a busy client machine compresses.)"""
    server = engines["b"]
    with live_router({"b": server.url}, tmp_path) as router:
        stream = client(router).completions.create(
            model=MODEL, prompt="Keep going", max_tokens=2000, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        first = next(iter(stream))
        assert first.choices[0].text is not None
        assert running(server) == 1, "the engine finished before the first chunk arrived"
        stream.close()
        wait_for(lambda: running(server) == 0, 60, "the engine to be idle")


def test_a_client_that_leaves_aborts_the_request_upstream(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    server = engines["a"]
    before = aborted(server)
    with live_router({"a": server.url}, tmp_path) as router:
        stream = client(router).completions.create(
            model=MODEL, prompt="Abandon me", max_tokens=2000, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        next(iter(stream))
        stream.close()
        wait_for(lambda: aborted(server) == before + 1, 60, "the engine to abort the request")
        wait_for(lambda: running(server) == 0, 60, "the engine to be idle")
        wait_for(
            lambda: router.metric("kvscale_router_in_flight", replica="a") == 0,
            30, "the router to release the request",
        )  # fmt: skip


def test_errors_become_openai_error_bodies(engines: dict[str, LiveServer], tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with live_router({"a": engines["a"].url}, tmp_path) as router:
        with pytest.raises(openai.BadRequestError) as upstream_error:  # the engine's own 400
            client(router).completions.create(model=MODEL, prompt="x", max_tokens=100_000)
        assert "max" in upstream_error.value.message.lower()
        reply = httpx.post(f"{router.api}/completions", content=b"{not json", timeout=30)
        assert reply.status_code == 400
        assert reply.json()["error"]["type"] == "invalid_request_error"
    with live_router({"dead": dead}, tmp_path) as router:
        reply = httpx.post(f"{router.api}/completions", json={"prompt": "x"}, timeout=30)
        assert reply.status_code == 503 and int(reply.headers["retry-after"]) >= 1
        assert reply.json()["error"]["code"] == "no_replica"


def test_a_dead_replica_is_skipped_before_the_first_byte(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    replicas = {"dead": f"http://127.0.0.1:{free_port()}", "a": engines["a"].url}
    with live_router(replicas, tmp_path, "--policy", "round-robin") as router:
        api = client(router)
        for i in range(6):
            out = api.completions.create(
                model=MODEL, prompt=f"retry {i}", max_tokens=3, extra_body={"ignore_eos": True}
            )
            assert out.choices[0].finish_reason == "length"  # sampled: EOS would end it early
        retries = router.metric("kvscale_router_retries_total", reason="unreachable")
        dead_picks = router.metric("kvscale_router_picks_total", replica="dead", rule="round_robin")
        assert retries == dead_picks >= 1  # every pick of the dead replica was retried
        assert router.metric("kvscale_router_requests_total", replica="a", code="200") == 6


@contextmanager
def dropping_front(upstream: str, drops: int) -> Iterator[str]:
    """A TCP front for `upstream` that closes its first `drops` connections unanswered, as a
    replica whose accept queue overflowed fails them, and relays every later one byte for byte."""
    target = urlsplit(upstream)
    loop = asyncio.new_event_loop()
    dropped = 0

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal dropped
        if dropped < drops:
            dropped += 1
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(target.hostname, target.port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = loop.run_until_complete(asyncio.start_server(serve, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_lone_replica_that_drops_a_connection_is_tried_again(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    with (
        dropping_front(engines["a"].url, drops=2) as front,
        live_router({"a": front}, tmp_path) as router,
    ):
        out = client(router).completions.create(
            model=MODEL, prompt="again", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert out.choices[0].finish_reason == "length"
        assert router.metric("kvscale_router_retries_total", reason="unreachable") == 2
        assert router.metric("kvscale_router_requests_total", replica="a", code="200") == 1


def test_weight_zero_drains_a_replica_while_its_stream_finishes(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    a, b = engines["a"], engines["b"]
    with live_router(urls(engines), tmp_path, weights={"a": 1.0, "b": 0.0}) as router:
        stream = client(router).completions.create(
            model=MODEL, prompt="Finish me", max_tokens=1500, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = iter(stream)
        first = next(chunks)
        router.set_weights({"a": 0.0, "b": 1.0})  # drain a
        a_before, b_before = served(a), served(b)
        for i in range(4):
            client(router).completions.create(model=MODEL, prompt=f"new {i}", max_tokens=2)
        rest = list(chunks)
        assert served(a) == a_before and served(b) > b_before  # no new work for a
        assert rest[-1].choices[0].finish_reason == "length"  # the in-flight stream finished
        text = first.choices[0].text + "".join(c.choices[0].text for c in rest)
        assert len(rest) + 1 == 1500 and text


def test_requests_are_held_while_no_replica_may_take_them(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    args = ("--max-pending", "1")
    with (
        live_router(urls(engines), tmp_path, *args, weights={"a": 0, "b": 0}) as router,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        held = pool.submit(
            client(router).completions.create,
            model=MODEL,
            prompt="from zero",
            max_tokens=4,
            extra_body={"ignore_eos": True},  # whichever replica takes it, 4 tokens
        )
        wait_for(lambda: router.metric("kvscale_router_pending_requests") == 1, 30, "a hold")
        over = httpx.post(f"{router.api}/completions", json={"prompt": "x"}, timeout=30)
        assert over.status_code == 503 and over.json()["error"]["code"] == "pending_full"
        assert int(over.headers["retry-after"]) >= 1
        assert not held.done()
        router.set_weights({"a": 1.0, "b": 1.0})
        assert held.result(timeout=60).choices[0].finish_reason == "length"
        assert router.metric("kvscale_router_pending_requests") == 0
    with live_router(urls(engines), tmp_path, "--pending-timeout", "0.5",
                     weights={"a": 0, "b": 0}) as router:  # fmt: skip
        late = httpx.post(f"{router.api}/completions", json={"prompt": "x"}, timeout=30)
        assert late.status_code == 503 and late.json()["error"]["code"] == "pending_timeout"


def test_class_limits_refuse_with_429_and_retry_after(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    classes = (
        '[{"name": "interactive", "maxConcurrency": 1, "maxQueue": 0}, {"name": "batch",'
        ' "maxConcurrency": 1, "maxQueue": 4, "maxQueueWaitSeconds": 0.5}]'
    )
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    with (
        live_router(urls(engines), tmp_path, "--traffic-classes", classes,
                    weights={"a": 0, "b": 0}) as router,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):  # fmt: skip
        # held requests keep their class slot: one of each class is in flight now
        first = pool.submit(httpx.post, f"{router.api}/completions", json=body, timeout=60)
        second = pool.submit(httpx.post, f"{router.api}/completions", json=body, timeout=60,
                             headers={"x-kvscale-class": "batch"})  # fmt: skip
        wait_for(lambda: router.metric("kvscale_router_pending_requests") == 2, 30, "two holds")
        with pytest.raises(openai.RateLimitError) as full:
            client(router).completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert full.value.response.headers["retry-after"] == "10"  # the class's queue wait
        assert full.value.body["code"] == "queue_full"  # type: ignore[index]
        late = httpx.post(f"{router.api}/completions", json=body, timeout=30,
                          headers={"x-kvscale-class": "batch"})  # fmt: skip
        assert late.status_code == 429 and late.json()["error"]["code"] == "deadline"
        assert late.headers["retry-after"] == "1"
        router.set_weights({"a": 1.0, "b": 1.0})
        assert first.result(timeout=60).status_code == second.result(timeout=60).status_code == 200
        refusals = router.metrics()
        assert (
            refusals[
                'kvscale_router_refusals_total{reason="queue_full",traffic_class="interactive"}'
            ]
            == 1
        )
        assert (
            refusals['kvscale_router_refusals_total{reason="deadline",traffic_class="batch"}'] == 1
        )


def test_a_draining_replica_answering_503_is_skipped(
    engines: dict[str, LiveServer], tmp_path: Path
) -> None:
    a = engines["a"]
    with live_router(urls(engines), tmp_path, "--policy", "round-robin") as router:
        assert httpx.post(f"{a.admin_url}/drain", timeout=30).status_code == 200
        try:
            for i in range(4):
                out = client(router).completions.create(model=MODEL, prompt=f"d{i}", max_tokens=2)
                assert out.choices[0].finish_reason == "length"
        finally:
            httpx.post(f"{a.admin_url}/undrain", timeout=30)
        assert router.metric("kvscale_router_retries_total", reason="503") >= 1
        assert router.metric("kvscale_router_requests_total", replica="b", code="200") == 4


def test_a_replica_dying_mid_stream_is_reported_in_band(llama_dir: Path, tmp_path: Path) -> None:
    with (
        live_server(llama_dir, tmp_path, *LONG) as doomed,
        live_router({"doomed": doomed.url}, tmp_path) as router,
    ):
        stream = client(router).completions.create(
            model=MODEL, prompt="Short-lived", max_tokens=2000, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = iter(stream)
        next(chunks)
        doomed.process.kill()
        with pytest.raises(openai.APIError, match="mid-stream"):
            for _ in chunks:
                pass
        wait_for(
            lambda: router.metric(
                "kvscale_router_requests_total", replica="doomed", code="upstream_failed"
            ) == 1,
            30, "the failure in the router's metrics",
        )  # fmt: skip
