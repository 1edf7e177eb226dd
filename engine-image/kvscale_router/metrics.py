"""Every metric the router exports, under `kvscale_router_`, in one registry per app."""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# the time the router itself adds: tenths of a millisecond up to a tenth of a second
ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# a replica missing from the weights (gone, or not Ready) keeps its series this long, idle
FORGET_AFTER_S = 600.0
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p = "kvscale_router_"
        self.requests = Counter(
            f"{p}requests", "Requests answered, by replica and HTTP status (replica is empty "
            "when the router answered itself)", ["replica", "code"], registry=r)  # fmt: skip
        self.picks = Counter(
            f"{p}picks", "Replica picks, by replica and rule (affinity, ring, least_loaded, "
            "round_robin)", ["replica", "rule"], registry=r)  # fmt: skip
        self.retries = Counter(
            f"{p}retries", "Requests sent again to another replica before their first byte",
            ["reason"], registry=r)  # fmt: skip
        self.refusals = Counter(
            f"{p}refusals", "Requests the router refused, by reason and traffic class",
            ["reason", "traffic_class"], registry=r)  # fmt: skip
        self.upstream_errors = Counter(
            f"{p}upstream_errors", "Replica failures, by replica and kind", ["replica", "kind"],
            registry=r)  # fmt: skip
        self.queue_depth = Gauge(
            f"{p}queue_depth", "Requests waiting in the router's class queue", ["traffic_class"],
            registry=r)  # fmt: skip
        self.queue_wait = Histogram(
            f"{p}queue_wait_seconds", "Time admitted requests waited in the class queue",
            ["traffic_class"], buckets=WAIT_BUCKETS, registry=r)  # fmt: skip
        self.pending_requests = Gauge(
            f"{p}pending_requests", "Requests held while no replica is ready (scale-from-zero "
            "demand)", registry=r)  # fmt: skip
        self.pending_wait = Histogram(
            f"{p}pending_wait_seconds", "Time requests were held until a replica was ready",
            buckets=WAIT_BUCKETS, registry=r)  # fmt: skip
        self.added = Histogram(
            f"{p}added_latency_seconds", "Time the router adds before the request reaches a "
            "replica plus relaying its first byte (queueing and holding excluded)",
            buckets=ADDED_BUCKETS, registry=r)  # fmt: skip
        self.in_flight = Gauge(
            f"{p}in_flight", "Requests in flight, by replica", ["replica"], registry=r
        )
        self.outstanding_tokens = Gauge(
            f"{p}outstanding_tokens", "Prompt plus requested output tokens in flight, by replica",
            ["replica"], registry=r)  # fmt: skip
        self.weight = Gauge(
            f"{p}replica_weight", "The weight each known replica is routed with (0 = no new "
            "requests)", ["replica"], registry=r)  # fmt: skip
        self.routable = Gauge(f"{p}routable_replicas", "Replicas with a weight above 0", registry=r)
        # deferrable classes: the backlog the capacity law reads, and how it was served
        self.deferred_requests = Gauge(
            f"{p}deferred_queue_requests", "Deferrable requests waiting for spare capacity or "
            "their deadline", ["traffic_class"], registry=r)  # fmt: skip
        self.deferred_tokens = Gauge(
            f"{p}deferred_queue_tokens", "Tokens (prompt estimate + max output) of queued "
            "deferrable requests due within due_within seconds (cumulative)",
            ["traffic_class", "due_within"], registry=r)  # fmt: skip
        self.deferred_oldest = Gauge(
            f"{p}deferred_oldest_age_seconds", "Age of the oldest queued deferrable request",
            ["traffic_class"], registry=r)  # fmt: skip
        self.deferred_released = Counter(
            f"{p}deferred_released", "Deferrable requests released to a replica, by reason "
            "(spare: into spare capacity; deadline: its deadline required it)",
            ["traffic_class", "reason"], registry=r)  # fmt: skip
        self.deferred_missed = Counter(
            f"{p}deferred_deadline_missed", "Deferrable requests that did not make their "
            "deadline, by reason (refused: unmeetable on arrival; expired: became unmeetable "
            "while queued; late: finished after it)", ["traffic_class", "reason"],
            registry=r)  # fmt: skip
        self.deferred_completed = Counter(
            f"{p}deferred_completed", "Deferrable requests that ended, by outcome (met: answered "
            "in full within the deadline; missed: answered past it, or refused because it could "
            "no longer be met)", ["traffic_class", "outcome"], registry=r)  # fmt: skip
        self.deferred_served_tokens = Counter(
            f"{p}deferred_served_tokens", "Prompt + output tokens of deferrable requests answered "
            "in full, by why they were released (spare: into spare capacity; deadline: their "
            "deadline required it)", ["traffic_class", "release"], registry=r)  # fmt: skip
        self.valley_tokens = Counter(
            f"{p}deferred_valley_tokens", "Tokens of deferrable requests released while the "
            "endpoint was in a valley: no interactive request waiting and every replica under "
            "its spare budget", ["traffic_class"], registry=r)  # fmt: skip
        self.decode_rate = Gauge(
            f"{p}deferred_decode_rate_tokens_per_second", "Per-request decode rate learned per "
            "replica from completed deferrable requests (the prior until one completed)",
            ["replica"], registry=r)  # fmt: skip
        self.build_info = Gauge(
            f"{p}build_info", "1, labelled with the router's version",
            ["version", "python_version"], registry=r)  # fmt: skip
        self.build_info.labels(version(), platform.python_version()).set(1)
        self._missing_since: dict[str, float] = {}  # replica -> when it left the weights

    def show_weights(
        self, weights: dict[str, float], busy: Iterable[str] = (), now: float | None = None
    ) -> None:
        """Publish the known replicas' weights. A replica missing from them (gone, or not Ready
        for a while: a crashed engine restarting) is shown at weight 0 at once, and its series
        are removed once it has been missing and idle (no request in flight: `busy`) for
        FORGET_AFTER_S: long enough for the errors of its last moments to be scraped, and for a
        restart not to reset its counters, yet a scale-in's or a rollout's pods do not pile up."""
        now = time.monotonic() if now is None else now
        here = set(weights) | set(busy)
        for name in here:
            self._missing_since.pop(name, None)
        labelled = {values[0] for values in _children(self.weight, ("replica",))}
        for name in labelled - set(weights):
            self.weight.labels(name).set(0.0)
        for name in self._labelled_replicas() - here:
            self._missing_since.setdefault(name, now)
        gone = {n for n, since in self._missing_since.items() if now - since >= FORGET_AFTER_S}
        if gone:
            self.forget_replicas(self._labelled_replicas() - gone)
            for name in gone:
                del self._missing_since[name]
        for name, value in weights.items():
            self.weight.labels(name).set(value)
        self.routable.set(sum(1 for w in weights.values() if w > 0))

    def _labelled_replicas(self) -> set[str]:
        return {
            values[0]
            for metric, names in self._per_replica()
            for values in _children(metric, names)
            if values[0]
        }

    def _per_replica(self) -> tuple[tuple[Counter | Gauge, tuple[str, ...]], ...]:
        return (
            (self.requests, ("replica", "code")),
            (self.picks, ("replica", "rule")),
            (self.upstream_errors, ("replica", "kind")),
            (self.in_flight, ("replica",)),
            (self.outstanding_tokens, ("replica",)),
            (self.weight, ("replica",)),
        )

    def forget_replicas(self, keep: set[str]) -> None:
        """Remove the series of every replica not in `keep` (the router's own answers, labelled
        with an empty replica, stay)."""
        for metric, names in self._per_replica():
            for values in _children(metric, names):
                if values[0] and values[0] not in keep:
                    metric.remove(*values)


def version() -> str:
    """kvscale's installed version ("unknown" when run from a tree that is not installed)."""
    try:
        return metadata.version("kvscale")
    except metadata.PackageNotFoundError:
        return "unknown"


def _children(metric: Counter | Gauge, names: tuple[str, ...]) -> set[tuple[str, ...]]:
    """The label values of every series `metric` holds, in the order of `names`."""
    return {
        tuple(sample.labels[n] for n in names)
        for family in metric.collect()
        for sample in family.samples
    }
