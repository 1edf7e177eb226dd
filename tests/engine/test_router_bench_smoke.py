"""The router benchmarks still run end to end in quick mode; `make bench` measures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADLINES = {
    "router_overhead": "added_p50_ms",
    "router_prefix": "hit_rate_ratio",
    "router_reweight": "reweight_s",
}


def test_router_benchmarks_run_in_quick_mode(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench", *HEADLINES, "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, key in HEADLINES.items():
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert key in result and "met" in result, name
    prefix = json.loads((tmp_path / "router_prefix.json").read_text())
    assert all(run["failed"] == 0 for runs in prefix["runs"].values() for run in runs)
    reweight = json.loads((tmp_path / "router_reweight.json").read_text())
    assert reweight["failed_requests"] == 0
    assert reweight["reweight_s"] is not None  # the hot replica's weight did drop
