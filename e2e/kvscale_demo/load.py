"""A load generator for the closed-loop tests (e2e/tests, e2e/real): streaming completions
through the official `openai` client at a request rate the test changes while it runs, recording
every request.

It runs its own event loop on a thread, so a synchronous test can start it, wait on the cluster
with `wait_for`, change the concurrency, and read the results at any time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import openai


@dataclass(frozen=True)
class Result:
    started: float  # time.monotonic()
    ttft_s: float | None
    error: str | None  # None: a complete answer


class Load:
    """Open-loop load: requests start at `rate` per second whatever the server does, so the
    demand a test asks for does not depend on how fast this machine happens to serve."""

    def __init__(self, base_url: str, model: str, max_tokens: int = 48) -> None:
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.results: list[Result] = []
        self._sent: list[float] = []  # when each request started, answered or not yet
        self._rate = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=180)

    def set_rate(self, per_second: float) -> None:
        self._rate = per_second

    def since(self, start: float) -> list[Result]:
        with self._lock:
            return [r for r in self.results if r.started >= start]

    def between(self, start: float, end: float) -> list[Result] | None:
        """The requests started in [start, end), once every one of them has ended (None before):
        a window fixed by when requests were sent, so slow answers are not left out of it."""
        with self._lock:
            sent = sum(1 for t in self._sent if start <= t < end)
            done = [r for r in self.results if start <= r.started < end]
        return done if len(done) == sent and time.monotonic() >= end else None

    def failures(self) -> list[Result]:
        with self._lock:
            return [r for r in self.results if r.error is not None]

    async def _main(self) -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        running: set[asyncio.Task[None]] = set()
        n, next_at = 0, time.monotonic()
        while not self._stop.is_set():
            if self._rate <= 0:
                next_at = time.monotonic()
                await asyncio.sleep(0.05)
                continue
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += 1.0 / self._rate
            n += 1
            task = asyncio.create_task(self._one(client, n))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running, return_exceptions=True)
        await client.close()

    async def _one(self, client: openai.AsyncOpenAI, n: int) -> None:
        prompt = f"Request {n}: tell me about autoscaling on Kubernetes, please."
        started = time.monotonic()
        with self._lock:
            self._sent.append(started)
        ttft, error = None, None
        try:
            stream = await client.completions.create(
                model=self.model,
                prompt=prompt,
                max_tokens=self.max_tokens,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for chunk in stream:
                if ttft is None and chunk.choices and chunk.choices[0].text:
                    ttft = time.monotonic() - started
        except openai.APIError as err:
            error = f"{type(err).__name__}: {err}"
        with self._lock:
            self.results.append(Result(started, ttft, error))


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0
