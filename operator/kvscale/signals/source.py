"""What a signal source is asked (a `Target`) and what it promises (`SignalSource`).

Two sources implement it: `DirectScrape` (`signals.direct`, the embedded default) reads every
ready replica's /metrics itself; `PrometheusSource` (`signals.prometheus`) asks Prometheus. The
operator calls `await source.snapshot(target, now)` once per tick of a loop and hands the
`Snapshot` to a control law; it never needs to know which source answered.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from kvscale.signals.snapshot import DeferredBacklog, Latency, Problem, ReplicaSignals, Snapshot

STALE_INTERVALS = 3  # a sample older than this many capacity intervals is stale


@dataclass(frozen=True)
class PodAddress:
    """A pod whose /metrics a source may read: its name, its IP, the port serving /metrics."""

    name: str
    ip: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class Target:
    """One endpoint at one tick: which replicas count, over what window, how fresh is fresh.

    `pods` are the endpoint's Ready engine pods that have an IP (the operator lists them from
    the API server); `routers` are its router pods, read only for the pending-request gauge
    (`kvscale_router_pending_requests`) that drives a scale from zero.
    """

    namespace: str
    endpoint: str
    window_s: float  # rates and quantiles cover the last window_s seconds
    capacity_interval_s: float  # samples older than 3 of these are stale
    pods: tuple[PodAddress, ...] = ()
    routers: tuple[PodAddress, ...] = ()
    metrics_path: str = "/metrics"

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.capacity_interval_s <= 0:
            raise ValueError("window_s and capacity_interval_s must be positive")

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.endpoint)

    @property
    def stale_after_s(self) -> float:
        return STALE_INTERVALS * self.capacity_interval_s


class SignalSource(ABC):
    """A way to read an endpoint's signals. The contract every implementation keeps:

    - `snapshot(target, now)` returns one `Snapshot` and never raises for what the replicas or
      Prometheus did: trouble becomes `problem` (+ a sentence in `message`), in this order of
      precedence:
      `Unreachable` when a ready replica (or Prometheus itself) could not be read and nothing
      recent stands in for it; `Missing` when replicas answered without the contract's metrics,
      or a replica has no window yet (one reading, counters that began before the window);
      `Stale` when a replica's newest sample is older than `target.stale_after_s`.
      With no ready pods and no trouble the snapshot is empty and fine (`pending_requests`
      still says whether demand waits at the router).
    - Replica values are those of the window ending at the replica's newest sample;
      `sample_age_s` says how old that sample is at `now`.
    - Rates are per second over (at most) `target.window_s`, counter resets handled; latency
      quantiles come from histogram bucket increases, endpoint-wide ones from the merged buckets.
    - A source may keep state between calls (the direct scrape remembers past samples); it is
      per source object, keyed by `target.key`, and `forget(namespace, endpoint)` drops it.
    - Sources are async context managers; `aclose()` releases their connections.
    """

    @abstractmethod
    async def snapshot(self, target: Target, now: float) -> Snapshot:
        """The endpoint's signals over the window ending now."""

    def forget(self, namespace: str, endpoint: str) -> None:
        """Drop what the source remembers of an endpoint (it was deleted)."""
        del namespace, endpoint

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections."""

    async def __aenter__(self) -> SignalSource:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


@dataclass(frozen=True)
class Trouble:
    """Something that makes a snapshot untrustworthy, with the pods it concerns."""

    problem: Problem
    what: str  # a sentence without its period: "Metrics of llama-0 could not be read (...)"


def judged(
    target: Target,
    now: float,
    replicas: Sequence[ReplicaSignals],
    latency: Latency,
    prefix_hit_rate: float | None,
    pending: float,
    troubles: Sequence[Trouble],
    deferred: tuple[DeferredBacklog, ...] = (),
) -> Snapshot:
    """The snapshot with its problem: the gravest trouble wins, the message names them all."""
    troubles = [*troubles, *_stale(target, replicas)]
    problem = None
    for candidate in (Problem.UNREACHABLE, Problem.MISSING, Problem.STALE):
        if any(t.problem is candidate for t in troubles):
            problem = candidate
            break
    message = "; ".join(t.what for t in troubles)
    return Snapshot(
        taken_at=now,
        window_s=target.window_s,
        replicas=tuple(sorted(replicas, key=lambda r: r.pod)),
        latency=latency,
        prefix_hit_rate=prefix_hit_rate,
        problem=problem,
        message=message,
        pending_requests=pending,
        deferred=deferred,
    )


def _stale(target: Target, replicas: Sequence[ReplicaSignals]) -> list[Trouble]:
    old = sorted(r.pod for r in replicas if r.sample_age_s > target.stale_after_s)
    if not old:
        return []
    age = max(r.sample_age_s for r in replicas)
    return [
        Trouble(
            Problem.STALE,
            f"The newest sample of {replicas_named(old)} is {age:.0f} s old "
            f"(stale after {target.stale_after_s:.0f} s)",
        )
    ]


def pods(names: Sequence[str], limit: int = 3) -> str:
    """A short list of pod names for a message: `a, b, c and 7 more`."""
    shown = ", ".join(names[:limit])
    more = len(names) - limit
    return f"{shown} and {more} more" if more > 0 else shown


def replicas_named(names: Sequence[str]) -> str:
    """`replica a` or `replicas a, b`, to start a sentence about them."""
    return f"{'replica' if len(names) == 1 else 'replicas'} {pods(names)}"
