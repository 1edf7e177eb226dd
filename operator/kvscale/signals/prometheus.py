"""The Prometheus signal source: the same snapshot, computed by PromQL over the window.

For endpoints whose replicas Prometheus already scrapes (`scaling.signals.source: prometheus`).
Series are selected by `namespace` and `pod` — the target labels that both the usual
annotation-driven pod scrape config and a PodMonitor put on every series — restricted to the
target's ready pods, so a pod that just left does not linger in the window. Rates are
`rate(...[w])`; quantiles are `histogram_quantile(q, sum by (le) (rate(..._bucket[w])))`, per pod
(`by (pod, le)`) and endpoint-wide. Each signal accepts vLLM's spellings across versions through
`or`, newest first, so a pod exporting both counts once. `up == 0` makes a pod Unreachable, a
pod Prometheus has no series for is Missing, and Prometheus itself being unreachable makes the
whole snapshot Unreachable.

`prometheus-api-client` is synchronous: each query runs in a worker thread, all of a snapshot's
queries at once.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, replace
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from kvscale.signals import deferred as dq
from kvscale.signals.contract import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    REQUIRED_COUNTERS,
    REQUIRED_GAUGES,
    REQUIRED_HISTOGRAMS,
    CounterKey,
    GaugeKey,
    HistogramKey,
    Spelling,
    counter_sample_names,
    spelt_for,
)
from kvscale.signals.snapshot import DeferredBacklog, Latency, Problem, ReplicaSignals, Snapshot
from kvscale.signals.source import SignalSource, Target, Trouble, judged, replicas_named

QUANTILES = (0.5, 0.99)
PerPod = dict[str, float]


@dataclass(frozen=True)
class Queries:
    """The PromQL of one snapshot; pure, so the text can be read and tested on its own."""

    target: Target

    @property
    def window(self) -> str:
        return f"{max(1, round(self.target.window_s * 1000))}ms"

    def selector(self, spelling: Spelling | None = None, routers: bool = False) -> str:
        pods = self.target.routers if routers else self.target.pods
        names = "|".join(p.name.replace(".", "\\\\.") for p in pods)
        terms = [f'namespace="{self.target.namespace}"', f'pod=~"{names}"']
        terms += [f'{k}!="{v}"' for k, v in (spelling.exclude if spelling else ())]
        return "{" + ",".join(terms) + "}"

    def counter(self, key: CounterKey) -> str:
        s = COUNTERS[key]
        names = [n for family in s.names for n in counter_sample_names(family)]
        return " or ".join(
            f"sum by (pod) (rate({n}{self.selector(s)}[{self.window}]))" for n in names
        )

    def gauge(self, key: GaugeKey) -> str:
        s = GAUGES[key]
        op = {"sum": "sum", "max": "max", "mean": "avg"}[s.combine]
        return " or ".join(f"{op} by (pod) ({n}{self.selector(s)})" for n in s.names)

    def quantile(self, key: HistogramKey, q: float, by_pod: bool) -> str:
        s, by = HISTOGRAMS[key], "pod, le" if by_pod else "le"
        rates = " or ".join(
            f"sum by ({by}) (rate({n}_bucket{self.selector(s)}[{self.window}]))" for n in s.names
        )
        return f"histogram_quantile({q}, {rates})"

    def newest_sample(self) -> str:
        names = GAUGES[GaugeKey.RUNNING].names
        return " or ".join(f"max by (pod) (timestamp({n}{self.selector()}))" for n in names)

    def up(self) -> str:
        return f"up{self.selector()}"

    def pending(self) -> str:
        return f"sum({GAUGES[GaugeKey.PENDING].names[0]}{self.selector(routers=True)})"

    def deferred(self) -> dict[str, str]:
        """The routers' deferred queue (signals/deferred.py), by class and bucket or label."""
        sel, w = self.selector(routers=True), self.window
        return {
            "requests": f"sum by (traffic_class) ({dq.REQUESTS}{sel})",
            "oldest": f"max by (traffic_class) ({dq.OLDEST}{sel})",
            "tokens": f"sum by (traffic_class, due_within) ({dq.TOKENS}{sel})",
            "served": f"sum by (traffic_class, release) (rate({dq.SERVED}_total{sel}[{w}]))",
            "completed": f"sum by (traffic_class, outcome) (rate({dq.COMPLETED}_total{sel}[{w}]))",
        }


class PrometheusSource(SignalSource):
    """Asks one Prometheus. `PrometheusSource("http://prometheus:9090", timeout_s=5.0)`."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout_s
        self._prom = PrometheusConnect(url=self.url, retry=Retry(total=0), timeout=timeout_s)

    async def snapshot(self, target: Target, now: float) -> Snapshot:
        queries = Queries(target)
        try:
            pending = await self._pending(queries, now)
            deferred = await self._deferred(queries, now)
            if not target.pods:
                return judged(target, now, [], Latency(), None, pending, [], deferred)
            return replace(await self._engines(queries, now, pending), deferred=deferred)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as err:
            why = f"Prometheus at {self.url} could not be queried ({_short(err)})"
            return judged(
                target, now, [], Latency(), None, 0.0, [Trouble(Problem.UNREACHABLE, why)]
            )

    async def aclose(self) -> None:
        self._prom.close()

    async def _pending(self, queries: Queries, now: float) -> float:
        if not queries.target.routers:
            return 0.0
        return sum((await self._query(queries.pending(), now, by_pod=False)).values())

    async def _deferred(self, queries: Queries, now: float) -> tuple[DeferredBacklog, ...]:
        if not queries.target.routers:
            return ()
        texts = queries.deferred()
        at = {"time": f"{now:.3f}"}
        answers = await asyncio.gather(
            *(asyncio.to_thread(self._prom.custom_query, t, at) for t in texts.values())
        )
        got = dict(zip(texts, answers, strict=True))
        return deferred_from_vectors(got)

    async def _engines(self, queries: Queries, now: float, pending: float) -> Snapshot:
        target = queries.target
        texts: dict[object, str] = {
            "up": queries.up(),
            "newest": queries.newest_sample(),
            **{k: queries.counter(k) for k in CounterKey},
            **{k: queries.gauge(k) for k in GaugeKey if k is not GaugeKey.PENDING},
            **{(k, q, True): queries.quantile(k, q, True) for k in HistogramKey for q in QUANTILES},
            **{
                (k, q, False): queries.quantile(k, q, False)
                for k in HistogramKey
                for q in QUANTILES
            },
        }
        answers = await asyncio.gather(
            *(self._query(text, now, by_pod=not (isinstance(key, tuple) and not key[2]))
              for key, text in texts.items())
        )  # fmt: skip
        got = dict(zip(texts, answers, strict=True))
        replicas, troubles = _replicas(target, got, now)
        counters = {k: got[k] for k in CounterKey}
        latency = Latency(
            ttft_p50=_value(got[(HistogramKey.TTFT, 0.5, False)]),
            ttft_p99=_value(got[(HistogramKey.TTFT, 0.99, False)]),
            itl_p50=_value(got[(HistogramKey.ITL, 0.5, False)]),
            itl_p99=_value(got[(HistogramKey.ITL, 0.99, False)]),
        )
        queried = sum(counters[CounterKey.PREFIX_QUERIES].values())
        hits = sum(counters[CounterKey.PREFIX_HITS].values())
        gauges = [r.prefix_hit_rate for r in replicas if r.prefix_hit_rate is not None]
        prefix = hits / queried if queried > 0 else (sum(gauges) / len(gauges) if gauges else None)
        return judged(target, now, replicas, latency, prefix, pending, troubles)

    async def _query(self, text: str, now: float, by_pod: bool) -> PerPod:
        result = await asyncio.to_thread(self._prom.custom_query, text, {"time": f"{now:.3f}"})
        out: PerPod = {}
        for series in result:
            key = series["metric"].get("pod", "") if by_pod else ""
            out[key] = float(series["value"][1])
        return out


def _replicas(
    target: Target, got: dict[object, PerPod], now: float
) -> tuple[list[ReplicaSignals], list[Trouble]]:
    down = sorted(p.name for p in target.pods if got["up"].get(p.name) == 0)
    unknown = sorted(p.name for p in target.pods if p.name not in got["up"])
    troubles = []
    if down:
        what = f"Prometheus could not scrape {replicas_named(down)} (up == 0)"
        troubles.append(Trouble(Problem.UNREACHABLE, what))
    if unknown:
        what = f"Prometheus has no scrape target for {replicas_named(unknown)}"
        troubles.append(Trouble(Problem.MISSING, what))
    required: list[CounterKey | GaugeKey] = [*REQUIRED_COUNTERS, *REQUIRED_GAUGES]
    lacking = {
        p.name: [_family(k) for k in required if p.name not in got[k]]
        + [
            spelt_for(HISTOGRAMS[h], "vllm")
            for h in REQUIRED_HISTOGRAMS
            if p.name not in got[(h, 0.5, True)]
        ]
        for p in target.pods
        if p.name not in down and p.name not in unknown
    }
    lacking = {pod: names for pod, names in lacking.items() if names}
    if lacking:
        first = sorted(lacking)
        what = (
            f"Series of {replicas_named(first)} lack {', '.join(lacking[first[0]])} over the window"
        )
        troubles.append(Trouble(Problem.MISSING, what))
    replicas = [_signals(p.name, got, now) for p in target.pods if p.name in got[GaugeKey.RUNNING]]
    return replicas, troubles


def _signals(pod: str, got: dict[object, PerPod], now: float) -> ReplicaSignals:
    def rate(key: CounterKey) -> float:
        return got[key].get(pod, 0.0)

    def quantile(key: HistogramKey, q: float) -> float | None:
        return _value({"": got[(key, q, True)][pod]} if pod in got[(key, q, True)] else {})

    queries = got[CounterKey.PREFIX_QUERIES].get(pod)
    if queries is None:
        hit_rate = got[GaugeKey.PREFIX_HIT_RATE].get(pod)
    else:
        hit_rate = rate(CounterKey.PREFIX_HITS) / queries if queries > 0 else None
    newest = got["newest"].get(pod)
    return ReplicaSignals(
        pod=pod,
        prompt_tokens_per_s=rate(CounterKey.PROMPT_TOKENS),
        generation_tokens_per_s=rate(CounterKey.GENERATION_TOKENS),
        running=got[GaugeKey.RUNNING].get(pod, 0.0),
        waiting=got[GaugeKey.WAITING].get(pod, 0.0),
        kv_usage=got[GaugeKey.KV_USAGE].get(pod, 0.0),
        preemptions_per_s=rate(CounterKey.PREEMPTIONS),
        refusals_per_s=rate(CounterKey.REFUSALS),
        successes_per_s=rate(CounterKey.SUCCESSES),
        latency=Latency(
            ttft_p50=quantile(HistogramKey.TTFT, 0.5),
            ttft_p99=quantile(HistogramKey.TTFT, 0.99),
            itl_p50=quantile(HistogramKey.ITL, 0.5),
            itl_p99=quantile(HistogramKey.ITL, 0.99),
        ),
        prefix_hit_rate=hit_rate,
        sample_age_s=max(0.0, now - newest) if newest is not None else 0.0,
        deferred_waiting=got[GaugeKey.DEFERRED_WAITING].get(pod, 0.0),
        deferred_preemptions_per_s=rate(CounterKey.DEFERRED_PREEMPTIONS),
    )


def deferred_from_vectors(got: dict[str, list[dict[str, Any]]]) -> tuple[DeferredBacklog, ...]:
    """The backlogs from the instant vectors of `Queries.deferred()`, keyed alike."""

    def per(answer: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
        return {
            tuple(s["metric"].get(label, "") for label in labels): float(s["value"][1])
            for s in answer
        }

    due: dict[str, dict[float, float]] = {}
    for (cls, bound), tokens in per(got["tokens"], "traffic_class", "due_within").items():
        if bound:
            due.setdefault(cls, {})[float(bound)] = tokens
    rates: dict[tuple[str, str], dict[str, float]] = {}
    for key, label, series in (
        ("served", "release", dq.SERVED),
        ("completed", "outcome", dq.COMPLETED),
    ):
        for (cls, value), rate in per(got[key], "traffic_class", label).items():
            rates.setdefault((series, value), {})[cls] = rate
    return dq.from_series(
        {c: v for (c,), v in per(got["requests"], "traffic_class").items()},
        {c: v for (c,), v in per(got["oldest"], "traffic_class").items()},
        due,
        rates,
    )


def _family(key: CounterKey | GaugeKey) -> str:
    return (COUNTERS[key] if isinstance(key, CounterKey) else GAUGES[key]).names[0]


def _value(answer: PerPod) -> float | None:
    """One number from an instant vector; None for no series or NaN (no observations)."""
    values = [v for v in answer.values() if not math.isnan(v)]
    return values[0] if values else None


def _short(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__
