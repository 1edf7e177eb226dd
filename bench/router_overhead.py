"""Router overhead: the time `kvscale-router` adds to a streamed request, against going direct.

A fast upstream (a minimal SSE server in its own process, answering at once) takes an open-loop
Poisson load of streamed completions at 200 requests/s, alternately direct and through the
router (another process), interleaved in rounds so that other load on the machine hits both
sides alike. Added time is the difference of the percentiles of time to first byte (router
minus direct), as a client sees it; the router's own histogram
(`kvscale_router:added_latency_seconds`) is reported next to it.
The upstream is deliberately not the engine: a CPU engine cannot answer 200 requests/s, and a
slow upstream would hide the router's cost in its noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

FULL: dict[str, Any] = {"rate": 200.0, "requests": 2000, "rounds": 3, "chunks": 16}
QUICK: dict[str, Any] = {"rate": 50.0, "requests": 100, "rounds": 1, "chunks": 4}
TARGET = {"added_p50_ms": 1.0, "added_p99_ms": 5.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def child(cmd: list[str], url: str, what: str) -> Iterator[str]:
    """A child process serving `url`; yields once /ready answers 200."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode()[-3000:] if proc.stderr else ""
                raise RuntimeError(f"{what} did not start:\n{err}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def router_server(replicas: Mapping[str, str], *args: str) -> Iterator[str]:
    """`kvscale-router --replicas ...` on a free loopback port."""
    port = free_port()
    spec = ",".join(f"{name}={url}" for name, url in replicas.items())
    cmd = [sys.executable, "-m", "kvscale_router.cli", "--host", "127.0.0.1", "--port",
           str(port), "--replicas", spec, "--log-level", "warning", *args]  # fmt: skip
    with child(cmd, f"http://127.0.0.1:{port}", "the router") as url:
        yield url


@contextmanager
def fast_upstream(chunks: int) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "bench.router_overhead", "--upstream", str(port), str(chunks)]
    with child(cmd, f"http://127.0.0.1:{port}", "the fast upstream") as url:
        yield url


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


async def _one(client: httpx.AsyncClient, url: str, body: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/v1/completions", content=body) as resp:
        resp.raise_for_status()
        async for _ in resp.aiter_raw():
            if first is None:
                first = time.perf_counter() - start
    assert first is not None
    return first, time.perf_counter() - start


async def drive(url: str, rate: float, count: int, seed: int) -> list[tuple[float, float]]:
    """Open-loop Poisson arrivals; (time to first byte, end to end) per request, seconds."""
    rng = random.Random(seed)
    body = json.dumps({"model": "m", "prompt": "hello " * 32, "stream": True}).encode()
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        for _ in range(20):  # warm the connection pool and both servers
            await _one(client, url, body)
        start = time.perf_counter()
        offsets, at = [], 0.0
        for _ in range(count):
            offsets.append(at)
            at += rng.expovariate(rate)

        async def later(offset: float) -> tuple[float, float]:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await _one(client, url, body)

        return await asyncio.gather(*(later(o) for o in offsets))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _histogram_quantiles(metrics: str) -> dict[str, float | None]:
    """p50/p99 of kvscale_router:added_latency_seconds from its buckets (upper bounds)."""
    buckets: list[tuple[float, float]] = []
    for line in metrics.splitlines():
        if line.startswith("kvscale_router:added_latency_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    total = buckets[-1][1] if buckets else 0.0

    def upper(q: float) -> float | None:
        for bound, count in buckets:
            if total and count >= q * total:
                return round(bound * 1000, 3)
        return None

    return {"p50_upper_bound_ms": upper(0.5), "p99_upper_bound_ms": upper(0.99)}


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    direct: list[tuple[float, float]] = []
    routed: list[tuple[float, float]] = []
    rounds: list[dict[str, float]] = []
    with fast_upstream(p["chunks"]) as upstream, router_server({"up": upstream}) as router:
        for r in range(p["rounds"]):
            sides = [("direct", upstream), ("router", router)]
            if r % 2:
                sides.reverse()
            got = {name: asyncio.run(drive(url, p["rate"], p["requests"], seed=r))
                   for name, url in sides}  # fmt: skip
            direct += got["direct"]
            routed += got["router"]
            rounds.append({
                "added_p50_ms": 1000 * (pct([t for t, _ in got["router"]], 0.5)
                                        - pct([t for t, _ in got["direct"]], 0.5)),
                "added_p99_ms": 1000 * (pct([t for t, _ in got["router"]], 0.99)
                                        - pct([t for t, _ in got["direct"]], 0.99)),
            })  # fmt: skip
        own = _histogram_quantiles(httpx.get(f"{router}/metrics", timeout=10).text)

    def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
        ttfb, e2e = [t for t, _ in samples], [e for _, e in samples]
        return {
            "ttfb_p50_ms": 1000 * pct(ttfb, 0.5), "ttfb_p99_ms": 1000 * pct(ttfb, 0.99),
            "e2e_p50_ms": 1000 * pct(e2e, 0.5), "e2e_p99_ms": 1000 * pct(e2e, 0.99),
        }  # fmt: skip

    d, rt = summary(direct), summary(routed)
    added_p50 = rt["ttfb_p50_ms"] - d["ttfb_p50_ms"]
    added_p99 = rt["ttfb_p99_ms"] - d["ttfb_p99_ms"]
    return {
        "added_p50_ms": round(added_p50, 3),
        "added_p99_ms": round(added_p99, 3),
        "target": "added_p50_ms < 1 and added_p99_ms < 5 (streaming, 200 req/s, fast upstream)",
        "met": {
            "added_p50_ms": added_p50 < TARGET["added_p50_ms"],
            "added_p99_ms": added_p99 < TARGET["added_p99_ms"],
        },
        "direct": {k: round(v, 3) for k, v in d.items()},
        "router": {k: round(v, 3) for k, v in rt.items()},
        "added_e2e_p50_ms": round(rt["e2e_p50_ms"] - d["e2e_p50_ms"], 3),
        "added_e2e_p99_ms": round(rt["e2e_p99_ms"] - d["e2e_p99_ms"], 3),
        "per_round": [{k: round(v, 3) for k, v in x.items()} for x in rounds],
        "per_round_median_added_p50_ms": round(
            statistics.median(x["added_p50_ms"] for x in rounds), 3
        ),
        "router_own_histogram": own,
        "workload": p | {"arrivals": "Poisson, open loop", "requests_per_side": len(direct)},
        "notes": "added = router percentile minus direct percentile of time to first byte, "
        "pooled over interleaved rounds; the upstream, the router and the load generator are "
        "three processes sharing this machine's CPUs",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream", nargs=2, type=int, metavar=("PORT", "CHUNKS"))
    args = parser.parse_args()
    if args.upstream:
        _serve_upstream(*args.upstream)
