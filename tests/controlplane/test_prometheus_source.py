"""PrometheusSource against a real Prometheus (Debian's binary) scraping loopback replicas.

No Kubernetes here: Prometheus scrapes static targets that carry the `namespace` and `pod`
labels a pod scrape gives, from servers that export the engine's own metrics with counters
that advance with wall time (100 prompt tokens/s), so the expected rates do not depend on how
busy the machine is. The test fails, never skips, when Prometheus is not installed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_api_client import PrometheusConnect
from prometheus_client import generate_latest

from kvscale.signals.contract import CounterKey, HistogramKey
from kvscale.signals.prometheus import PrometheusSource, Queries
from kvscale.signals.snapshot import Problem, Snapshot
from kvscale.signals.source import PodAddress, Target
from kvscale_cluster import process
from kvscale_cluster.body_handler import BodyHandler
from kvscale_cluster.ports import free_port
from kvscale_cluster.prometheus import prometheus_binary
from kvscale_cluster.wait import GiveUp, wait_for
from kvscale_engine.server.metrics import EngineMetrics, StatsSnapshot

VLLM_V0_10 = Path(__file__).parents[1] / "data" / "metrics" / "vllm_v0_10.txt"
WINDOW_S = 10.0


@dataclass
class Exporter:
    """A replica's /metrics on its own port; `render` gives the text of the moment."""

    name: str
    render: Callable[[], str]
    port: int = field(default_factory=free_port)

    @property
    def address(self) -> PodAddress:
        return PodAddress(self.name, "127.0.0.1", self.port)


def engine(ttft_s: float, requests_per_s: float, start: float) -> Callable[[], str]:
    """An engine whose counters follow the clock: 100 prompt and 50 generation tokens/s."""
    metrics = EngineMetrics("tiny-llama", 512, ["default"])
    done = [0]

    def render() -> str:
        elapsed = time.time() - start
        tokens = int(100 * elapsed)
        metrics.observe_stats(
            StatsSnapshot(4, 2, 256, 128, 0.5, 0, tokens, tokens // 4, tokens, tokens // 2)
        )
        while done[0] < int(requests_per_s * elapsed):
            done[0] += 1
            metrics.observe_first_token(ttft_s)
            metrics.observe_inter_token(0.02)
        return generate_latest(metrics.registry).decode()

    return render


@contextmanager
def serving(exporters: list[Exporter]) -> Iterator[None]:
    servers = []
    for exporter in exporters:

        class Handler(BodyHandler):
            render = staticmethod(exporter.render)

            def do_GET(self) -> None:
                self.reply(self.render().encode(), "text/plain; version=0.0.4")

        server = ThreadingHTTPServer(("127.0.0.1", exporter.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        yield
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@contextmanager
def prometheus(targets: dict[str, int], work: Path) -> Iterator[tuple[str, process.Component]]:
    """Prometheus scraping `pod name -> port` every second, labelled as pods of `ns`."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "pods",
                "scrape_timeout": "900ms",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "ns", "pod": pod}}
                    for pod, port in targets.items()
                ],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    argv = [
        prometheus_binary(),  # raises when Prometheus is not installed: the test fails
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address={url.removeprefix('http://')}",
        "--log.level=warn",
    ]
    prom = process.start("prometheus", argv, work)
    try:
        wait_for(lambda: _ready(url, prom), 60, "prometheus /-/ready")
        yield url, prom
    finally:
        process.stop(prom.pid)


def _ready(url: str, prom: process.Component) -> bool:
    if not process.alive(prom.pid):
        raise GiveUp(f"prometheus exited:\n{process.tail(prom.log)}")
    return bool(PrometheusConnect(url).check_prometheus_connection())


def snapshot(source: PrometheusSource, target: Target) -> Snapshot:
    return asyncio.run(source.snapshot(target, time.time()))


def test_prometheus_source_reads_rates_quantiles_and_problems(tmp_path: Path) -> None:
    start = time.time()
    fast = Exporter("llama-fast", engine(ttft_s=0.05, requests_per_s=3, start=start))
    slow = Exporter("llama-slow", engine(ttft_s=2.0, requests_per_s=1, start=start))
    vllm = Exporter("vllm-0", VLLM_V0_10.read_text)
    router = Exporter("router-0", lambda: "kvscale_router_pending_requests 3\n")
    gone = Exporter("gone-0", str)  # scraped by Prometheus, never served: up == 0
    targets = {e.name: e.port for e in (fast, slow, vllm, router, gone)}
    with serving([fast, slow, vllm, router]), prometheus(targets, tmp_path) as (url, prom):
        client = PrometheusConnect(url)
        full = f'min(count_over_time(up{{pod=~"llama-.*"}}[{WINDOW_S:.0f}s])) >= {WINDOW_S:.0f}'
        wait_for(lambda: client.custom_query(full), 90, "a full window of samples")
        source = PrometheusSource(url)
        engines = Target("ns", "llama", WINDOW_S, 10, (fast.address, slow.address),
                         (router.address,))  # fmt: skip
        snap = snapshot(source, engines)
        assert snap.ok, snap.message
        by_pod = {r.pod: r for r in snap.replicas}
        for r in by_pod.values():
            # rate() extrapolates to the window's edges: close to, not exactly, 100/s
            assert r.prompt_tokens_per_s == pytest.approx(100, rel=0.2)
            assert r.generation_tokens_per_s == pytest.approx(50, rel=0.2)
            assert (r.running, r.waiting, r.kv_usage) == (4, 2, 0.5)
            assert r.prefix_hit_rate == pytest.approx(0.25, abs=0.05)
            assert 0 <= r.sample_age_s < 5
        assert snap.pending_requests == 3
        # TTFT buckets (0.04, 0.06] and (1.0, 2.5]; 3 fast requests/s for every slow one
        f, s = by_pod["llama-fast"].latency, by_pod["llama-slow"].latency
        assert f.ttft_p50 is not None and 0.04 < f.ttft_p50 <= 0.06
        assert f.ttft_p99 is not None and 0.04 < f.ttft_p99 <= 0.06
        assert s.ttft_p50 is not None and 1.0 < s.ttft_p50 <= 2.5
        assert snap.latency.ttft_p50 is not None and 0.04 < snap.latency.ttft_p50 <= 0.06
        assert snap.latency.ttft_p99 is not None and 1.0 < snap.latency.ttft_p99 <= 2.5
        assert snap.latency.itl_p50 is not None and 0.01 < snap.latency.itl_p50 <= 0.025
        assert snap.tokens_per_s == pytest.approx(300, rel=0.2)

        # vLLM v0.10 exports old and new names side by side: each signal counts once
        (v,) = snapshot(source, Target("ns", "vllm", WINDOW_S, 10, (vllm.address,))).replicas
        assert v.kv_usage == 0.8125 and (v.running, v.waiting) == (7, 3)
        assert v.prompt_tokens_per_s == 0  # a static text: nothing counted in the window

        ghost = PodAddress("ghost", "10.0.0.9", 1)  # ready, but Prometheus has no target for it
        missing = snapshot(source, Target("ns", "llama", WINDOW_S, 10, (fast.address, ghost)))
        assert missing.problem is Problem.MISSING and "ghost" in missing.message
        down = snapshot(source, Target("ns", "llama", WINDOW_S, 10, (fast.address, gone.address)))
        assert down.problem is Problem.UNREACHABLE and "gone-0" in down.message
        assert "up == 0" in down.message

        process.stop(prom.pid)
        stopped = snapshot(source, engines)
        assert stopped.problem is Problem.UNREACHABLE
        assert url in stopped.message and stopped.replicas == ()
        asyncio.run(source.aclose())


def test_queries_select_the_ready_pods_of_the_namespace() -> None:
    pods = (PodAddress("a-0", "10.0.0.1", 8000), PodAddress("b.x", "10.0.0.2", 8000))
    q = Queries(Target("team", "llama", 60, 60, pods))
    sel = '{namespace="team",pod=~"a-0|b\\\\.x"}'
    assert q.selector() == sel
    assert q.counter(CounterKey.PROMPT_TOKENS) == (
        f"sum by (pod) (rate(vllm:prompt_tokens_total{sel}[60000ms]))"
        f" or sum by (pod) (rate(vllm:prompt_tokens{sel}[60000ms]))"
        f" or sum by (pod) (rate(sglang:prompt_tokens_total{sel}[60000ms]))"
        f" or sum by (pod) (rate(sglang:prompt_tokens{sel}[60000ms]))"
    )
    assert q.quantile(HistogramKey.ITL, 0.99, by_pod=False) == (
        f"histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{sel}"
        f"[60000ms])) or sum by (le) (rate(vllm:time_per_output_token_seconds_bucket{sel}"
        f"[60000ms])) or sum by (le) (rate(sglang:inter_token_latency_seconds_bucket{sel}"
        f"[60000ms])) or sum by (le) (rate(sglang:time_per_output_token_seconds_bucket{sel}"
        f"[60000ms])))"
    )
    assert 'finished_reason!="abort"' in q.counter(CounterKey.SUCCESSES)
