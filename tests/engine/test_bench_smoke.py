"""`python -m bench --quick` still runs end to end; `make bench` measures, this keeps it working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADLINES = {
    "engine_throughput": "continuous_vs_hf_static",
    "prefix_cache": "ttft_ratio",
    "kv_waste": "waste_fraction",
}


def test_engine_benchmarks_run_in_quick_mode(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench", *HEADLINES, "--quick", "--out", str(tmp_path)]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=300)
    for name, key in HEADLINES.items():
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result[key] > 0, name
        assert "cpu" in result["machine"]
    assert json.loads((tmp_path / "prefix_cache.json").read_text())["token_mismatches"] == 0
    throughput = json.loads((tmp_path / "engine_throughput.json").read_text())
    assert throughput["greedy_output_mismatches_vs_hf"] == 0
