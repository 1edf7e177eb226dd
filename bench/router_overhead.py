"""Router overhead: the time `kvscale-router` adds to a streamed request, against going direct.

A fast upstream (a minimal SSE server in its own process, answering at once) takes an open-loop
Poisson load of streamed completions at 200 requests/s, alternately direct and through the
router (another process), interleaved in rounds so that other load on the machine hits both
sides alike. Added time is the difference of the percentiles of time to first byte (router
minus direct), as a client sees it; the router's own histogram
(`kvscale_router_added_latency_seconds`) is reported next to it.
The upstream is deliberately not the engine: a CPU engine cannot answer 200 requests/s, and a
slow upstream would hide the router's cost in its noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx

from bench.machine import cpu_seconds
from bench.serving import served
from kvscale_cluster.ports import free_port

FULL: dict[str, Any] = {"rate": 200.0, "requests": 1000, "rounds": 6, "chunks": 8}
QUICK: dict[str, Any] = {"rate": 50.0, "requests": 100, "rounds": 1, "chunks": 4}
TARGET = {"added_p50_ms": 1.0, "added_p99_ms": 5.0}


@contextmanager
def router_process(replicas: Mapping[str, str], *args: str) -> Iterator[tuple[str, int]]:
    """`kvscale-router --replicas ...` on a free loopback port: (url, pid)."""
    port = free_port()
    spec = ",".join(f"{name}={url}" for name, url in replicas.items())
    cmd = [sys.executable, "-m", "kvscale_router.cli", "--host", "127.0.0.1", "--port",
           str(port), "--replicas", spec, "--log-level", "warning", *args]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with served(cmd, env, port, start_s=120, what="the router") as process:
        yield process.url, process.pid


@contextmanager
def router_server(replicas: Mapping[str, str], *args: str) -> Iterator[str]:
    with router_process(replicas, *args) as (url, _):
        yield url


@contextmanager
def fast_upstream(chunks: int) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "bench.router_overhead", "--upstream", str(port), str(chunks)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with served(cmd, env, port, start_s=120, what="the fast upstream") as process:
        yield process.url


def _serve_upstream(port: int, chunks: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    event = b'data: {"choices": [{"index": 0, "text": "x", "finish_reason": null}]}\n\n'

    async def events() -> AsyncIterator[bytes]:
        for _ in range(chunks):
            yield event
        yield b"data: [DONE]\n\n"

    async def complete(request: Request) -> Response:
        await request.body()
        return StreamingResponse(events(), media_type="text/event-stream")

    async def ready(request: Request) -> Response:
        return Response("ok")

    app = Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                            Route("/ready", ready)])  # fmt: skip
    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)  # fmt: skip


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    async with session.post(f"{url}/v1/completions", data=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - start
    assert first is not None
    return first, time.perf_counter() - start


async def drive(url: str, rate: float, count: int, seed: int) -> list[tuple[float, float]]:
    """Open-loop Poisson arrivals; (time to first byte, end to end) per request, seconds.

    The client is aiohttp: at 200 requests/s httpx's own CPU cost swamped what it measured.
    """
    rng = random.Random(seed)
    body = json.dumps({"model": "m", "prompt": "hello " * 32, "stream": True}).encode()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(20):  # warm the connection pool and both servers
            await _one(session, url, body)
        start = time.perf_counter()
        offsets, at = [], 0.0
        for _ in range(count):
            offsets.append(at)
            at += rng.expovariate(rate)

        async def later(offset: float) -> tuple[float, float]:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await _one(session, url, body)

        return await asyncio.gather(*(later(o) for o in offsets))


async def one_at_a_time(url: str, count: int) -> list[float]:
    """Closed loop, one request in flight: latency without any queueing."""
    body = json.dumps({"model": "m", "prompt": "hello " * 32, "stream": True}).encode()
    async with aiohttp.ClientSession() as session:
        for _ in range(20):
            await _one(session, url, body)
        return [(await _one(session, url, body))[0] for _ in range(count)]


def _sequential(upstream: str, router: str, count: int) -> dict[str, float]:
    direct: list[float] = []
    routed: list[float] = []
    for r in range(2):  # interleaved
        for name, url in (("direct", upstream), ("router", router))[:: 1 if r == 0 else -1]:
            (direct if name == "direct" else routed).extend(asyncio.run(one_at_a_time(url, count)))
    out: dict[str, float] = {}
    for q in (50, 99):
        d, rt = 1000 * pct(direct, q / 100), 1000 * pct(routed, q / 100)
        out |= {f"direct_p{q}_ms": round(d, 3), f"router_p{q}_ms": round(rt, 3),
                f"added_p{q}_ms": round(rt - d, 3)}  # fmt: skip
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _histogram_quantiles(metrics: str) -> dict[str, float | None]:
    """p50/p99 of kvscale_router_added_latency_seconds from its buckets (upper bounds)."""
    buckets: list[tuple[float, float]] = []
    for line in metrics.splitlines():
        if line.startswith("kvscale_router_added_latency_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    total = buckets[-1][1] if buckets else 0.0

    def upper(q: float) -> float | None:
        for bound, count in buckets:
            if total and count >= q * total:
                return round(bound * 1000, 3)
        return None

    return {"p50_upper_bound_ms": upper(0.5), "p99_upper_bound_ms": upper(0.99)}


def _side_by_side(upstream: str, router: str, rate: float, count: int, rounds: int
                  ) -> dict[str, Any]:  # fmt: skip
    direct: list[tuple[float, float]] = []
    routed: list[tuple[float, float]] = []
    per_round: list[dict[str, float]] = []
    for r in range(rounds):
        sides = [("direct", upstream), ("router", router)]
        if r % 2:
            sides.reverse()
        got = {name: asyncio.run(drive(url, rate, count, seed=r)) for name, url in sides}
        direct += got["direct"]
        routed += got["router"]
        ttfb = {name: [t for t, _ in samples] for name, samples in got.items()}
        per_round.append({
            f"added_p{q}_ms": 1000 * (pct(ttfb["router"], q / 100) - pct(ttfb["direct"], q / 100))
            for q in (50, 99)
        })  # fmt: skip

    def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
        ttfb, e2e = [t for t, _ in samples], [e for _, e in samples]
        return {
            "ttfb_p50_ms": 1000 * pct(ttfb, 0.5), "ttfb_p99_ms": 1000 * pct(ttfb, 0.99),
            "e2e_p50_ms": 1000 * pct(e2e, 0.5), "e2e_p99_ms": 1000 * pct(e2e, 0.99),
        }  # fmt: skip

    d, rt = summary(direct), summary(routed)
    return {
        "added_p50_ms": round(rt["ttfb_p50_ms"] - d["ttfb_p50_ms"], 3),
        "added_p99_ms": round(rt["ttfb_p99_ms"] - d["ttfb_p99_ms"], 3),
        "direct": {k: round(v, 3) for k, v in d.items()},
        "router": {k: round(v, 3) for k, v in rt.items()},
        "per_round": [{k: round(v, 3) for k, v in x.items()} for x in per_round],
        "per_round_median": {
            k: round(statistics.median(x[k] for x in per_round), 3) for k in per_round[0]
        },
        "requests_per_side": len(direct),
    }


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    load_before = os.getloadavg()[0]
    with fast_upstream(p["chunks"]) as upstream, router_process({"up": upstream}) as (router, pid):
        cpu_before = cpu_seconds(pid)
        headline = _side_by_side(upstream, router, p["rate"], p["requests"], p["rounds"])
        cpu_ms = 1000 * (cpu_seconds(pid) - cpu_before) / headline["requests_per_side"]
        own = _histogram_quantiles(httpx.get(f"{router}/metrics", timeout=10).text)
        light_rate = p["rate"] / 4
        light = _side_by_side(upstream, router, light_rate, p["requests"] // 4, 2)
        sequential = _sequential(upstream, router, p["requests"] // 4)
    met = {k: headline[k] < TARGET[k] for k in TARGET}
    return headline | {
        "target": "added_p50_ms < 1 and added_p99_ms < 5 (streaming, 200 req/s, fast upstream)",
        "met": met,
        "router_own_histogram_at_full_rate": own,
        f"at_{light_rate:g}_requests_per_s": light,
        "one_request_at_a_time": sequential,
        "router_cpu_ms_per_request_at_full_rate": round(cpu_ms, 3),
        "load_average_1m": {
            "before": round(load_before, 2),
            "after": round(os.getloadavg()[0], 2),
        },
        "workload": p | {"arrivals": "Poisson, open loop", "client": "aiohttp"},
        "notes": "added = router percentile minus direct percentile of time to first byte, "
        "pooled over interleaved rounds; the upstream, the router and the load generator are "
        "three processes sharing this machine's 2 CPUs with other jobs (see load_average_1m); "
        "router CPU per request is the router process's user + system time over the full-rate "
        "rounds divided by the requests it carried",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", nargs=2, type=int, metavar=("PORT", "CHUNKS"))
    args = parser.parse_args()
    if args.upstream:
        _serve_upstream(*args.upstream)
