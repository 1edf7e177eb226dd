"""Workloads: rate and time scaling, looping, ServeGen rates, file formats, reproducibility."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sim_helpers import TRACES

from kvscale.sim.arrivals import CHUNK_S, open_workload, sniff
from kvscale.traces import TraceError


def count(wl: object) -> int:
    return sum(len(c) for c in wl.chunks())  # type: ignore[attr-defined]


def test_rate_scale_multiplies_requests_and_time_scale_compresses_time() -> None:
    base = open_workload("azure-conv", TRACES, hours=None)
    assert count(base) == 300
    doubled = open_workload("azure-conv", TRACES, hours=None, rate_scale=2.0)
    assert count(doubled) == pytest.approx(600, rel=0.05)
    fast = open_workload("azure-conv", TRACES, hours=None, time_scale=2.0)
    assert fast.duration_s == pytest.approx(base.duration_s / 2)
    assert count(fast) == 300


def test_a_short_trace_loops_to_fill_the_hours() -> None:
    wl = open_workload("azure-conv", TRACES, hours=0.5)
    # 300 requests per ~85 s loop, for 1,800 s
    assert count(wl) == pytest.approx(300 * 1800 / 85, rel=0.1)


def test_windows_are_sorted_reproducible_and_cover_the_chunks() -> None:
    a = open_workload("mooncake", TRACES, hours=0.2, rate_scale=1.5, seed=3)
    b = open_workload("mooncake", TRACES, hours=0.2, rate_scale=1.5, seed=3)
    got = [a.window(t, t + 5.0) for t in np.arange(0.0, 600.0, 5.0)]
    assert sum(len(g) for g in got) == len(a.chunk(0))
    assert np.array_equal(np.concatenate([g.at for g in got]), b.chunk(0).at)
    assert all(np.all(np.diff(g.at) >= 0) for g in got)
    assert int(a.chunk(0).cached.max()) > 0  # Mooncake's shared prefixes survive
    with pytest.raises(ValueError, match="straddles"):
        a.window(CHUNK_S - 1.0, CHUNK_S + 1.0)


def test_servegen_rates_become_poisson_arrivals_with_named_lengths() -> None:
    wl = open_workload("servegen-m-large", TRACES, hours=1.0, rate_scale=0.01)
    first = wl.chunk(0)
    expected = wl.rates[0] * 600
    assert len(first) == pytest.approx(expected, rel=0.15)
    assert set(first.input.tolist()) <= set(wl.lengths.input.tolist())


def test_files_are_recognised_by_format(tmp_path: Path) -> None:
    assert sniff(TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv") == "azure"
    assert sniff(TRACES / "mooncake-fast25" / "conversation_trace.jsonl") == "mooncake"
    assert sniff(TRACES / "servegen" / "m-large-aggregate-rate-10min.csv") == "servegen"
    odd = tmp_path / "x.csv"
    odd.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="not an Azure CSV"):
        open_workload(str(odd), TRACES, hours=1)
    with pytest.raises(TraceError, match="unknown trace"):
        open_workload("nope", TRACES, hours=1)
