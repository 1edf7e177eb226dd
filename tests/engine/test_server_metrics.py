"""/metrics as Prometheus parses it: vLLM's names, types, labels and buckets, and kvscale's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from server_fixtures import MODEL, LiveServer, live_server

from kvscale_engine.server.metrics import EngineMetrics, StatsSnapshot, version

CLASSES = '[{"name": "interactive", "priority": 10}, {"name": "batch", "priority": 0}]'
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0]  # fmt: skip
REQUEST = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500]  # vLLM's 1-2-5 series up to max_model_len=512
EXPECTED: dict[str, tuple[str, list[float] | None]] = {
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:num_preemptions": ("counter", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:request_success": ("counter", None),
    "vllm:prefix_cache_queries": ("counter", None),
    "vllm:prefix_cache_hits": ("counter", None),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", REQUEST),
    "vllm:request_queue_time_seconds": ("histogram", REQUEST),
    "vllm:request_prompt_tokens": ("histogram", TOKENS),
    "vllm:request_generation_tokens": ("histogram", TOKENS),
    "vllm:cache_config_info": ("gauge", None),
    "kvscale_engine_kv_blocks": ("gauge", None),
    "kvscale_engine_kv_blocks_free": ("gauge", None),
    "kvscale_engine_admission_rejections": ("counter", None),
    "kvscale_engine_admission_queue_wait_seconds": ("histogram", TTFT),
    "kvscale_engine_admission_queue_depth": ("gauge", None),
    "kvscale_engine_admission_in_flight": ("gauge", None),
    "kvscale_engine_preemptions": ("counter", None),
    "kvscale_engine_requests_waiting": ("gauge", None),
}


@pytest.fixture(scope="module")
def server(llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    args = ("--traffic-classes", CLASSES, "--max-concurrency", "4")
    with live_server(llama_dir, tmp_path_factory.mktemp("metrics"), *args) as live:
        yield live


@pytest.fixture(scope="module")
def families(server: LiveServer) -> dict[str, Metric]:
    shared = "The paged cache hands out fixed-size blocks; " * 4
    for i in range(3):
        body = {"model": MODEL, "prompt": shared + str(i), "max_tokens": 8, "stream": True}
        with httpx.stream("POST", f"{server.api}/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            r.read()
    text = httpx.get(f"{server.url}/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_name_type_labels_and_buckets(families: dict[str, Metric], name: str) -> None:
    kind, buckets = EXPECTED[name]
    family = families[name]
    assert family.type == kind
    for sample in family.samples:
        if sample.name.endswith("_created"):
            continue
        assert sample.labels["engine"] == "0"
        if name != "vllm:cache_config_info":
            assert sample.labels["model_name"] == MODEL
    if buckets is not None:
        bounds = sorted(
            {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
        )
        assert bounds == [*buckets, float("inf")]


def test_values_follow_the_requests(families: dict[str, Metric]) -> None:
    def value(name: str, suffix: str = "", **labels: str) -> float:
        for s in families[name].samples:
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
        raise AssertionError(f"no sample {name}{suffix} {labels}")

    assert value("vllm:request_success", "_total", finished_reason="length") == 3
    assert value("vllm:generation_tokens", "_total") == 24
    assert value("vllm:time_to_first_token_seconds", "_count") == 3
    assert value("vllm:inter_token_latency_seconds", "_count") == 3 * 7
    assert value("vllm:e2e_request_latency_seconds", "_count") == 3
    assert value("vllm:request_generation_tokens", "_sum") == 24
    queries = value("vllm:prefix_cache_queries", "_total")
    assert (
        value("vllm:prompt_tokens", "_total")
        == queries
        == value("vllm:request_prompt_tokens", "_sum")
    )
    assert 0 < value("vllm:prefix_cache_hits", "_total") < queries  # the shared prefix, in tokens
    assert 0.0 <= value("vllm:kv_cache_usage_perc") <= 1.0
    assert value("kvscale_engine_kv_blocks_free") == value("kvscale_engine_kv_blocks") == 256
    assert value("vllm:num_requests_running") == 0
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16" and info["num_gpu_blocks"] == "256"
    for cls in ("interactive", "batch"):
        assert value("kvscale_engine_admission_rejections", "_total", reason="queue_full",
                     traffic_class=cls) == 0  # fmt: skip
        assert value("kvscale_engine_preemptions", "_total", traffic_class=cls) == 0
        assert value("kvscale_engine_requests_waiting", traffic_class=cls, deferrable="false") == 0
    assert (
        value("kvscale_engine_admission_queue_wait_seconds", "_count", traffic_class="interactive")
        == 3
    )


def test_build_info_names_the_version(families: dict[str, Metric]) -> None:
    (sample,) = families["kvscale_engine_build_info"].samples
    assert sample.value == 1 and sample.labels["version"] == version()


def test_waiting_counts_the_admission_queue_and_the_scheduler_by_class() -> None:
    metrics = EngineMetrics(MODEL, 512, ["interactive", "batch"], deferrable=["batch"])

    def waiting(cls: str | None = None) -> float:
        families = text_string_to_metric_families(metrics.render().decode())
        name = "kvscale_engine_requests_waiting" if cls else "vllm:num_requests_waiting"
        found = [s.value for f in families for s in f.samples
                 if s.name == name and s.labels.get("traffic_class", cls) == cls]  # fmt: skip
        assert len(found) == 1, (name, cls, found)
        return found[0]

    def stats(waiting: int, by_class: dict[str, int]) -> StatsSnapshot:
        return StatsSnapshot(0, waiting, 16, 16, 0.0, 0, 0, 0, 0, 0, waiting_by_class=by_class)

    metrics.observe_stats(stats(2, {"interactive": 1, "batch": 1}))
    metrics.set_admission_load("interactive", 3, 4)
    assert waiting() == 5
    assert (waiting("interactive"), waiting("batch")) == (4, 1)
    metrics.observe_stats(stats(0, {}))  # the scheduler emptied; the queue still holds three
    assert (waiting(), waiting("interactive"), waiting("batch")) == (3, 3, 0)
    metrics.set_admission_load("interactive", 0, 4)
    assert (waiting(), waiting("interactive"), waiting("batch")) == (0, 0, 0)
