"""`python -m bench operator_scale --quick` still runs: 50 replicas, every one read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_operator_scale_benchmark_runs_in_quick_mode(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench", "operator_scale", "--quick", "--out", str(tmp_path)]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "operator_scale.json").read_text())
    scrape = result["scrape"]
    assert scrape["replicas"] == 50 and scrape["all_read_after_first_tick"]
    assert scrape["ticks"][0]["problem"] == "Missing"  # one reading: no rates yet
    assert all(t["tokens_per_s"] > 0 for t in scrape["ticks"][1:])
    assert set(scrape["http_only"]) >= {"aiohttp_cpu_s", "httpx_cpu_s"}
