"""The embedded signal source: scrape every ready replica's /metrics, concurrently, each tick.

No Prometheus needed. Every call reads all of `target.pods` at once (at most `max_concurrency`
requests in flight, each with its own timeout), parses each answer into a `RawSample`, and keeps
the samples of the longest window asked per pod, so rates and quantiles cover `target.window_s`
whatever the tick (one source can serve a fast loop with a short window and a slow one). A
replica whose scrape fails this tick is carried on its last samples (an overloaded engine answers
slowly, and that is when its numbers matter most) until they go stale; when no ready replica
answers at all, the snapshot is `Unreachable`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from kvscale.signals.contract import GaugeKey
from kvscale.signals.deferred import DeferredReading, backlogs, parse_router
from kvscale.signals.raw import RawSample, parse_replica
from kvscale.signals.snapshot import DeferredBacklog, Problem, Snapshot
from kvscale.signals.source import PodAddress, SignalSource, Target, Trouble, judged, replicas_named
from kvscale.signals.window import (
    ReplicaWindow,
    base_index,
    endpoint_latency,
    endpoint_prefix_hit_rate,
    replica_window,
)

MAX_SAMPLES_PER_POD = 256  # bounds memory when ticks are much shorter than the window


@dataclass(frozen=True)
class Scraped:
    """One pod's answer this tick: a sample, or why there is none."""

    pod: str
    sample: RawSample | None
    error: str = ""
    deferred: DeferredReading | None = None  # a router's deferred queue


class DirectScrape(SignalSource):
    """Reads replicas over HTTP. Construct once per loop and reuse it: it remembers samples.

    `DirectScrape(timeout_s=5.0, max_concurrency=64)`; pass `session` to share an
    `aiohttp.ClientSession` (it is then not closed here) and `clock` to control sample times.
    aiohttp rather than httpx: reading 1,000 replicas, httpx's connection pool cost ~8x the
    CPU (its pool scans every connection for every request; see bench/operator_scale.py).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 5.0,
        max_concurrency: int = 64,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if timeout_s <= 0 or max_concurrency < 1:
            raise ValueError("timeout_s must be positive and max_concurrency at least 1")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_concurrency = max_concurrency
        self._limit = asyncio.Semaphore(max_concurrency)
        self._session = session
        self._owns_session = session is None
        self._clock = clock
        self._samples: dict[tuple[str, str], dict[str, list[RawSample]]] = {}
        self._keep_s: dict[tuple[str, str], float] = {}  # the longest window asked per endpoint
        # per endpoint, per router pod: its deferred readings over the window (counter rates)
        self._deferred: dict[tuple[str, str], dict[str, list[DeferredReading]]] = {}

    async def snapshot(self, target: Target, now: float) -> Snapshot:
        engines, routers = await asyncio.gather(
            asyncio.gather(*(self._scrape(target, pod) for pod in target.pods)),
            asyncio.gather(*(self._scrape(target, pod, router=True) for pod in target.routers)),
        )
        windows, troubles = self._windows(target, engines, now)
        pending, router_troubles = _pending(routers)
        if not target.pods:
            troubles += router_troubles
        return judged(
            target,
            now,
            [w.signals() for w in windows],
            endpoint_latency(windows),
            endpoint_prefix_hit_rate(windows),
            pending,
            troubles,
            self._backlogs(target, routers),
        )

    def _backlogs(self, target: Target, routers: list[Scraped]) -> tuple[DeferredBacklog, ...]:
        """The routers' deferred queues, with counter rates over the window per router."""
        store = self._deferred.setdefault(target.key, {})
        for name in set(store) - {r.pod for r in routers}:
            del store[name]
        newest, base = [], []
        for r in routers:
            history = store.setdefault(r.pod, [])
            if r.deferred is not None:
                history.append(r.deferred)
            if not history:
                continue
            latest = history[-1]
            older = [h for h in history[:-1] if h.taken_at <= latest.taken_at - target.window_s]
            before = older[-1] if older else (history[0] if len(history) > 1 else None)
            del history[: history.index(before) if before is not None else len(history) - 1]
            del history[:-MAX_SAMPLES_PER_POD]
            newest.append(latest)
            base.append(before)
        return backlogs(newest, base)

    def forget(self, namespace: str, endpoint: str) -> None:
        self._samples.pop((namespace, endpoint), None)
        self._keep_s.pop((namespace, endpoint), None)
        self._deferred.pop((namespace, endpoint), None)

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made inside the running loop, as aiohttp wants
            connector = aiohttp.TCPConnector(limit=self._max_concurrency)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def _scrape(self, target: Target, pod: PodAddress, router: bool = False) -> Scraped:
        url = f"{pod.base_url}{target.metrics_path}"
        async with self._limit:
            try:
                async with self._client().get(url, timeout=self._timeout) as response:
                    if response.status != 200:
                        return Scraped(pod.name, None, f"HTTP {response.status}")
                    body = await response.read()
            except TimeoutError:
                return Scraped(pod.name, None, f"no answer within {self._timeout.total:g} s")
            except aiohttp.ClientError as err:
                return Scraped(pod.name, None, f"{type(err).__name__}: {err}")
        text, at = body.decode(errors="replace"), self._clock()
        deferred = parse_router(text, at) if router else None
        return Scraped(pod.name, parse_replica(text, at), deferred=deferred)

    def _windows(
        self, target: Target, scraped: list[Scraped], now: float
    ) -> tuple[list[ReplicaWindow], list[Trouble]]:
        """Remember this tick's samples; one window per replica that has one."""
        store = self._samples.setdefault(target.key, {})
        # one source may serve a fast and a slow loop: keep what the longest window needs
        keep_s = self._keep_s[target.key] = max(self._keep_s.get(target.key, 0.0), target.window_s)
        for name in set(store) - {s.pod for s in scraped}:
            del store[name]  # no longer ready: its history would only mislead a later window
        windows, unread, no_window = [], [], []
        for result in scraped:
            history = store.setdefault(result.pod, [])
            if result.sample is not None:
                history.append(result.sample)
                del history[: base_index(history, keep_s)]
                del history[:-MAX_SAMPLES_PER_POD]
            window = replica_window(result.pod, history, target.window_s, now)
            if window is not None:
                windows.append(window)
            elif history:
                no_window.append(result.pod)
            else:
                unread.append(result.pod)
        return windows, _troubles(scraped, unread, no_window)


def _troubles(scraped: list[Scraped], unread: list[str], no_window: list[str]) -> list[Trouble]:
    """Nobody answered, or a replica never did; answers without the contract; no window yet."""
    errors = {s.pod: s.error for s in scraped if s.sample is None}
    troubles = []
    names = list(errors) if errors and len(errors) == len(scraped) else unread
    if names:
        why = f"Metrics of {replicas_named(names)} could not be read ({errors[names[0]]})"
        troubles.append(Trouble(Problem.UNREACHABLE, why))
    foreign = sorted(s.pod for s in scraped if s.sample and s.sample.read_nothing)
    if foreign:
        why = (
            f"Metrics of {replicas_named(foreign)} carry none of the series kvscale reads "
            f"(vLLM's or SGLang's names)"
        )
        troubles.append(Trouble(Problem.MISSING, why))
    incomplete = {
        s.pod: gone
        for s in scraped
        if s.sample and not s.sample.read_nothing and (gone := s.sample.missing())
    }
    if incomplete:
        names = sorted(incomplete)
        why = f"Metrics of {replicas_named(names)} lack {', '.join(incomplete[names[0]])}"
        troubles.append(Trouble(Problem.MISSING, why))
    if no_window:
        why = (
            f"Metrics of {replicas_named(sorted(no_window))} were read once so far: "
            "rates need a second reading"
        )
        troubles.append(Trouble(Problem.MISSING, why))
    return troubles


def _pending(routers: list[Scraped]) -> tuple[float, list[Trouble]]:
    """Requests the routers hold for want of a ready replica, and what kept us from knowing."""
    pending, troubles = 0.0, []
    for r in routers:
        if r.sample is None:
            troubles.append(
                Trouble(Problem.UNREACHABLE, f"Router {r.pod} could not be read ({r.error})")
            )
        elif GaugeKey.PENDING not in r.sample.gauges:
            troubles.append(
                Trouble(Problem.MISSING, f"Router {r.pod} lacks {r.sample.missing(True)[0]}")
            )
        else:
            pending += r.sample.gauges[GaugeKey.PENDING]
    return pending, troubles
