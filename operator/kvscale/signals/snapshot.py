"""The signals of one endpoint at one tick: what both control loops and the simulator read.

Both signal sources (a direct scrape of the replicas, Prometheus) return this one type, and the
simulator builds it from its model, so the control laws never know where numbers came from.
Rates are per second over the source's window; latency quantiles are computed from histogram
bucket deltas over that window (as `histogram_quantile` does), merged across replicas for the
endpoint-wide figures. `None` means "no observation", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Problem(StrEnum):
    """Why a snapshot cannot be trusted: the reason of `MetricsAvailable=False`."""

    MISSING = "Missing"  # replicas answered, but without the metrics the laws read
    STALE = "Stale"  # the newest sample is older than three capacity intervals
    UNREACHABLE = "Unreachable"  # the replicas or Prometheus could not be reached


@dataclass(frozen=True)
class Latency:
    """Quantiles over the window, in seconds; None when nothing was observed."""

    ttft_p50: float | None = None
    ttft_p99: float | None = None
    itl_p50: float | None = None
    itl_p99: float | None = None


@dataclass(frozen=True)
class ReplicaSignals:
    """One replica (pod) over the window."""

    pod: str
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1
    preemptions_per_s: float = 0.0
    refusals_per_s: float = 0.0
    successes_per_s: float = 0.0
    latency: Latency = Latency()
    prefix_hit_rate: float | None = None  # hits / queries, in tokens
    sample_age_s: float = 0.0  # age of this replica's newest sample
    created_at: float | None = None  # the pod's creationTimestamp (unix seconds), for victims
    ready_since: float | None = None  # when it last turned Ready (unix seconds; None: unknown)
    deferred_waiting: float = 0.0  # of `waiting`, deferred work (yielding to interactive work)
    deferred_preemptions_per_s: float = 0.0  # of `preemptions_per_s`, deferred work's

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens_per_s + self.generation_tokens_per_s


@dataclass(frozen=True)
class Fleet:
    """What the API server says of the replicas (filled by the operator, or the simulator)."""

    current: int = 0  # Deployment spec.replicas as last applied
    ready: int = 0
    starting: int = 0  # created, not Ready yet, and schedulable
    unschedulable: int = 0
    unschedulable_reason: str = ""
    startup_seconds: float | None = None  # measured pod created -> Ready (median of recent pods)


@dataclass(frozen=True)
class DeferredBacklog:
    """One deferrable class's requests the routers hold (earliest deadline first), summed over
    the routers, and what the replicas served of the class over the window.

    From the routers' `kvscale_router_deferred_*` series (signals/deferred.py names them); the
    simulator fills it from its own queue. `due` is cumulative, as a Prometheus histogram's
    buckets: (seconds, tokens of the held requests due within that many seconds of now), seconds
    ascending; +Inf, if present, holds every held token. A request's tokens are its prompt plus
    its `max_tokens` (what it may still cost).
    """

    traffic_class: str
    requests: float = 0.0
    oldest_age_s: float | None = None
    due: tuple[tuple[float, float], ...] = ()
    served_tokens_per_s: float = 0.0  # the class's prompt + generated tokens the replicas served
    valley_tokens_per_s: float = 0.0  # ... of those, released into spare capacity
    met_per_s: float = 0.0  # completions within their deadline
    missed_per_s: float = 0.0  # completions past it, and requests refused as too late

    @property
    def tokens(self) -> float:
        return max((tokens for _, tokens in self.due), default=0.0)

    @property
    def deadline_attainment(self) -> float | None:
        done = self.met_per_s + self.missed_per_s
        return self.met_per_s / done if done > 0 else None


@dataclass(frozen=True)
class Snapshot:
    """One endpoint at one tick: per-replica values, endpoint totals and quantiles, its age."""

    taken_at: float  # unix seconds
    window_s: float
    replicas: tuple[ReplicaSignals, ...] = ()
    latency: Latency = Latency()  # endpoint-wide, from merged histogram deltas
    prefix_hit_rate: float | None = None
    problem: Problem | None = None
    message: str = ""
    pending_requests: float = 0.0  # held by the router while no replica is ready (from zero)
    fleet: Fleet = field(default_factory=Fleet)
    deferred: tuple[DeferredBacklog, ...] = ()  # one per deferrable class the routers hold

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def deferred_tokens(self) -> float:
        return sum(d.tokens for d in self.deferred)

    @property
    def deferred_served_tokens_per_s(self) -> float:
        """Of the replicas' token rates, the part that served deferred work (not demand now)."""
        return sum(d.served_tokens_per_s for d in self.deferred)

    @property
    def newest_sample_age_s(self) -> float | None:
        if not self.replicas:
            return None
        return min(r.sample_age_s for r in self.replicas)

    @property
    def prompt_tokens_per_s(self) -> float:
        return sum(r.prompt_tokens_per_s for r in self.replicas)

    @property
    def generation_tokens_per_s(self) -> float:
        return sum(r.generation_tokens_per_s for r in self.replicas)

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_tokens_per_s + self.generation_tokens_per_s

    @property
    def running(self) -> float:
        return sum(r.running for r in self.replicas)

    @property
    def waiting(self) -> float:
        return sum(r.waiting for r in self.replicas)

    @property
    def deferred_waiting(self) -> float:
        """Of `waiting`, deferred work the routers released that waits in the engines."""
        return sum(min(r.waiting, r.deferred_waiting) for r in self.replicas)

    @property
    def interactive_waiting(self) -> float:
        """Waiting requests less deferred work: released deferred work waits in the engines by
        design (it yields to interactive requests and is preempted by them)."""
        return self.waiting - self.deferred_waiting

    @property
    def kv_usage_max(self) -> float:
        return max((r.kv_usage for r in self.replicas), default=0.0)

    @property
    def kv_usage_mean(self) -> float:
        return sum(r.kv_usage for r in self.replicas) / len(self.replicas) if self.replicas else 0.0

    @property
    def preemptions_per_s(self) -> float:
        return sum(r.preemptions_per_s for r in self.replicas)

    @property
    def interactive_preemptions_per_s(self) -> float:
        """Preemptions less those of deferred work by interactive arrivals (by design)."""
        return sum(
            max(0.0, r.preemptions_per_s - r.deferred_preemptions_per_s) for r in self.replicas
        )

    @property
    def refusals_per_s(self) -> float:
        return sum(r.refusals_per_s for r in self.replicas)

    @property
    def successes_per_s(self) -> float:
        return sum(r.successes_per_s for r in self.replicas)
