"""The replica set the router routes to, and the interface of what keeps it current.

A `ReplicaSource` owns the truth (the Kubernetes API in production, a fixed list for local use)
and pushes every change into the `ReplicaTable`; the proxy reads the table and waits on it while
no replica is routable (hold-from-zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvscale_router.weights import Published, effective_weight


@dataclass(frozen=True)
class Pod:
    """A Ready replica with an address."""

    name: str
    url: str
    ready_since: float  # unix seconds


class ReplicaTable:
    def __init__(self, warmup_s: float, clock: Callable[[], float] = time.time) -> None:
        self.warmup_s = warmup_s
        self.clock = clock
        self.pods: dict[str, Pod] = {}
        self.published: Published | None = None
        self.synced = False  # the source has listed the replicas at least once
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[set[str]], None]] = []

    def on_removed(self, listener: Callable[[set[str]], None]) -> None:
        self._listeners.append(listener)

    def set_pods(self, pods: Mapping[str, Pod]) -> None:
        gone = set(self.pods) - set(pods)
        self.pods = dict(pods)
        self.synced = True
        if gone:
            for listener in self._listeners:
                listener(gone)
        self._notify()

    def set_published(self, published: Published | None) -> None:
        self.published = published
        self._notify()

    def weights(self) -> dict[str, float]:
        """Every known pod's weight now (0 included)."""
        now = self.clock()
        return {
            name: effective_weight(name, now - pod.ready_since, self.published, self.warmup_s)
            for name, pod in self.pods.items()
        }

    def routable(self) -> dict[str, float]:
        return {name: w for name, w in self.weights().items() if w > 0}

    def next_warm_s(self) -> float | None:
        """Seconds until the next unpublished pod finishes its warm-up (it may become routable
        without any event)."""
        now = self.clock()
        published = self.published.weights if self.published else {}
        waits = [
            pod.ready_since + self.warmup_s - now
            for pod in self.pods.values()
            if pod.name not in published and now - pod.ready_since < self.warmup_s
        ]
        return max(0.0, min(waits)) if waits else None

    async def changed(self, timeout_s: float) -> None:
        """Return on the next change, or after timeout_s."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


class ReplicaSource(ABC):
    """Keeps a ReplicaTable current: lists the replicas and their weights, then follows changes
    until cancelled."""

    @abstractmethod
    async def run(self, table: ReplicaTable) -> None: ...

    @property
    @abstractmethod
    def description(self) -> str: ...
