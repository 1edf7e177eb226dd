"""`python -m bench --quick` still runs end to end; `make bench` measures, this keeps it working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENGINE_HEADLINES = {
    "engine_throughput": "continuous_vs_hf_static",
    "prefix_cache": "ttft_ratio",
    "kv_waste": "waste_fraction",
}
ROUTER_HEADLINES = {
    "router_overhead": "added_p50_ms",
    "router_prefix": "hit_rate_ratio",
    "router_reweight": "reweight_s",
}


def run_quick(names: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """Run the named benchmarks in quick mode; each one's JSON report, by name."""
    command = [sys.executable, "-m", "bench", *names, "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: json.loads((out / f"{name}.json").read_text()) for name in names}


def test_engine_benchmarks_run_in_quick_mode(tmp_path: Path) -> None:
    results = run_quick(list(ENGINE_HEADLINES), tmp_path, 300)
    for name, key in ENGINE_HEADLINES.items():
        assert results[name][key] > 0, name
        assert "cpu" in results[name]["machine"]
    assert results["prefix_cache"]["token_mismatches"] == 0
    assert results["engine_throughput"]["greedy_output_mismatches_vs_hf"] == 0
    waste = results["kv_waste"]
    # on-demand paged allocation leaves at most a partial last block per running sequence
    assert waste["mean_unused_slots_per_running_sequence"] <= waste["block_size"] - 1
    assert waste["waste_vs_oracle_reservation"] < 1


def test_router_benchmarks_run_in_quick_mode(tmp_path: Path) -> None:
    results = run_quick(list(ROUTER_HEADLINES), tmp_path, 600)
    for name, key in ROUTER_HEADLINES.items():
        assert key in results[name] and "met" in results[name], name
    prefix = results["router_prefix"]
    assert all(run["failed"] == 0 for runs in prefix["runs"].values() for run in runs)
    reweight = results["router_reweight"]
    assert reweight["failed_requests"] == 0
    assert reweight["reweight_s"] is not None  # the hot replica's weight did drop


def test_gpu_check_code_runs_on_the_cpu() -> None:
    """bench/gpu_check.sh runs rarely (a GPU is lent now and then): keep its code path working."""
    command = [sys.executable, "-m", "bench.gpu_check", "--cpu-smoke"]
    done = subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=300)
    result = json.loads(done.stdout)
    assert not any(key.endswith("_error") for key in result), result
    assert result["continuous_vs_hf_static"] > 0
    assert result["hf_static"]["batch_size"] in {int(b) for b in result["hf_batch_size_sweep"]}
    assert result["kvscale_continuous"]["output_tokens"] == result["hf_static"]["output_tokens"]


def test_deferred_preemption_benchmark_runs_in_quick_mode(tmp_path: Path) -> None:
    result = run_quick(["deferred_preemption"], tmp_path, 300)["deferred_preemption"]
    keys = {
        "preemptions_per_interactive_request", "preemptions_per_s", "deferred_completed",
        "deferred_output_tokens_per_s", "interactive_refused_or_failed",
        "ratio_with_to_without_backlog", "with_backlog", "without_backlog", "engine", "machine",
    }  # fmt: skip
    assert keys <= result.keys()
    assert result["interactive_refused_or_failed"] == 0
    for run in ("with_backlog", "without_backlog"):
        interactive = result[run]["interactive"]
        assert interactive["failed"] == interactive["refused"] == 0, run
        assert interactive["completed"] == interactive["requests"] > 0, run
    backlog = result["with_backlog"]["deferred"]
    assert backlog["sent"] > 0 and backlog["failed"] == 0 and backlog["output_tokens"] > 0
    assert result["without_backlog"]["deferred"]["preempted"] == 0
    assert set(result["ratio_with_to_without_backlog"]) == {
        "p50_ttft_s", "p99_ttft_s", "p50_itl_s", "p99_itl_s",
    }  # fmt: skip
    assert result["engine"]["num_kv_blocks"] > 0 and result["engine"]["torch_threads"] == 1
