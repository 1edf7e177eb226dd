"""`kvscale loadtest` against a live engine server: the report and the plots are produced."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from server_fixtures import live_server

from kvscale.tools.loadtest import add_loadtest_parser, run_loadtest

CLASSES = '[{"name": "interactive", "priority": 10}, {"name": "batch", "maxQueue": 2}]'


def _args(argv: list[str]) -> argparse.Namespace:
    root = argparse.ArgumentParser(prog="kvscale")
    add_loadtest_parser(root.add_subparsers(dest="command", required=True))
    return root.parse_args(["loadtest", *argv])


def test_loadtest_reports_on_our_server(llama_dir: Path, tmp_path: Path) -> None:
    server_args = ("--traffic-classes", CLASSES, "--max-concurrency", "8")
    with live_server(llama_dir, tmp_path, *server_args) as server:
        out = tmp_path / "report"
        args = _args([
            "--base-url", server.url, "--dataset", "mooncake", "--input-scale", "0.05",
            "--max-input-len", "300", "--max-output-len", "24", "--num-prompts", "60",
            "--arrival", "replay", "--time-scale", "50", "--classes", "interactive:0.5,batch:0.5",
            "--slo", "ttft=2s,itl=200ms", "--gpu-hour-price", "2.0", "--replicas", "2",
            "--scrape-interval", "0.2", "--output-dir", str(out), "--no-progress",
            "--save-detailed",
        ])  # fmt: skip
        assert run_loadtest(args) == 0

    report = json.loads((out / "loadtest.json").read_text())
    assert report["num_prompts"] == 60 and report["model_id"] == "tiny-llama"
    # invariants, whatever else runs on the machine: every request completed or was refused with
    # 429 (admission), and the counts add up; how many complete depends on the machine's speed
    refused = report["refusals"]["count"]
    assert report["completed"] + refused == 60 and report["completed"] >= 1
    assert set(report["errors_by_status"]) <= {"429"}
    assert sum(report["errors_by_status"].values()) == refused
    assert len(report["ttfts"]) == len(report["output_lens"]) == 60
    done = [n for n, t in zip(report["output_lens"], report["ttfts"], strict=True) if t]
    assert len(done) == report["completed"] and all(1 <= n <= 24 for n in done)  # capped
    assert sum(done) == report["total_output_tokens"]
    assert 0 < report["p50_ttft_ms"] <= report["p99_ttft_ms"]
    assert report["mean_e2el_ms"] >= report["mean_ttft_ms"]
    assert 0 <= report["server"]["prefix_cache_hit_rate"] <= 1
    assert report["server"]["generation_tokens"] >= report["total_output_tokens"]
    assert report["cost"]["cost_per_successful_request"] > 0
    assert set(report["per_class"]) == {"interactive", "batch"}
    for name in ("latency_cdf.png", "throughput.png", "queue_depth.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
