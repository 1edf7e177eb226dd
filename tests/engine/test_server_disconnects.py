"""200 concurrent streams, many cut off by their clients: afterwards no KV block is held."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
from server_fixtures import MODEL, LiveServer, live_server, wait_for

CLASSES = '[{"name": "default", "maxQueue": 1000, "maxQueueWaitSeconds": 600}]'


async def _one(client: httpx.AsyncClient, url: str, i: int, rng: random.Random) -> str:
    mode = rng.choice(["complete", "cut", "cut", "cancel"])
    body = {
        "model": MODEL, "prompt": f"Request {i}: the quick brown fox " * rng.randint(1, 6),
        "max_tokens": rng.randint(8, 48), "stream": True, "ignore_eos": True,
    }  # fmt: skip
    if mode == "cut":  # far longer than the cut point: it cannot finish before its client leaves
        body["max_tokens"] = 400
    elif rng.random() < 0.25:  # some non-streaming requests too
        body["stream"] = False
    cut_after = rng.randint(0, 6)

    async def run() -> str:
        async with client.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            if not body["stream"]:
                await resp.aread()
                return "complete"
            events = 0
            async for line in resp.aiter_lines():
                if line == "data: [DONE]":
                    return "complete"
                events += line.startswith("data: {")
                if mode == "cut" and events > cut_after:
                    return "cut"  # leaving the block closes the connection mid-stream
        raise AssertionError("stream ended without [DONE]")

    if mode == "cancel":
        try:
            return await asyncio.wait_for(run(), timeout=rng.uniform(0.0, 0.5))
        except TimeoutError:
            return "cancelled"
    return await run()


async def _storm(api: str, count: int) -> list[str]:
    rng = random.Random(7)
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        tasks = [_one(client, f"{api}/completions", i, rng) for i in range(count)]
        return await asyncio.gather(*tasks)


def test_random_disconnects_free_every_block(llama_dir: Path, tmp_path: Path) -> None:
    args = ("--traffic-classes", CLASSES, "--max-concurrency", "256", "--max-num-seqs", "128")
    with live_server(llama_dir, tmp_path, *args) as server:
        outcomes = asyncio.run(_storm(server.api, 200))
        assert outcomes.count("complete") >= 20
        assert outcomes.count("cut") + outcomes.count("cancelled") >= 50

        def settled(server: LiveServer = server) -> dict[str, float] | None:
            m = server.metrics()
            free = m['kvscale_engine_kv_blocks_free{engine="0",model_name="tiny-llama"}']
            total = m['kvscale_engine_kv_blocks{engine="0",model_name="tiny-llama"}']
            running = m['vllm:num_requests_running{engine="0",model_name="tiny-llama"}']
            waiting = m['vllm:num_requests_waiting{engine="0",model_name="tiny-llama"}']
            idle = free == total == 256 and running == waiting == 0
            return m if idle else None

        metrics = wait_for(settled, 60, "every KV block to be free again")
        in_flight = metrics['kvscale_engine_admission_in_flight{engine="0",model_name="tiny-llama",'
                            'traffic_class="default"}']  # fmt: skip
        aborted = metrics['vllm:request_success_total{engine="0",finished_reason="abort",'
                          'model_name="tiny-llama"}']  # fmt: skip
        assert in_flight == 0
        # every stream cut mid-way was aborted in the engine; cancelled ones may have been
        # refused before admission, and completed ones finished normally
        cut, cancelled = outcomes.count("cut"), outcomes.count("cancelled")
        assert cut >= 30 and cut <= aborted <= cut + cancelled, (cut, cancelled, aborted)

        # and it still serves
        ok = httpx.post(
            f"{server.api}/completions",
            json={"model": MODEL, "prompt": "still there?", "max_tokens": 4},
            timeout=60,
        )
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
