"""`kvscale simulate` end to end on the committed sample: the report's shape, plots, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_helpers import TRACES

from kvscale.cli import main


def test_report_has_the_issue_shape_and_plots(tmp_path: Path) -> None:
    code = main(
        ["simulate", "--trace", "azure-conv", "--traces-dir", str(TRACES), "--hours", "0.25",
         "--rate-scale", "8", "--dt", "2", "--policies", "kvscale,static,oracle", "--quiet",
         "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "simulate.json").read_text())
    policies = report["traces"]["azure-conv"]["policies"]
    assert set(policies) == {"kvscale", "static", "oracle"}
    for p in policies.values():
        for key in ("gpu_hours", "slo_minutes_fraction", "flaps", "cost_per_successful_request"):
            assert key in p
    assert policies["oracle"]["gpu_hours_vs_oracle"] == 1.0
    assert report["traces"]["azure-conv"]["slo_feasibility"]["feasible"]
    assert sorted(x.name for x in tmp_path.glob("*.png")) == [
        "azure-conv-replicas.png",
        "azure-conv-ttft-cdf.png",
    ]


def test_an_infeasible_slo_is_reported_not_tabled_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Mooncake's long prompts cannot be prefilled within 0.5 s on any replica
    code = main(
        ["simulate", "--trace", "mooncake", "--traces-dir", str(TRACES), "--hours", "0.05",
         "--dt", "5", "--ttft-slo", "0.5", "--policies", "oracle", "--quiet", "--no-plots",
         "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("WARNING: The 0.5 s TTFT SLO is infeasible for this workload: ")
    verdict = json.loads((tmp_path / "simulate.json").read_text())["traces"]["mooncake"][
        "slo_feasibility"
    ]
    assert not verdict["feasible"] and verdict["share_over_slo"] > 0.01
    assert verdict["suggested_ttft_slo_s"] > 2 * verdict["prefill_at_target_s"] - 1e-9
    assert f"plan would set {verdict['suggested_ttft_slo_s']:g} s" in out


def test_bad_input_is_refused_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--trace", "nope", "--traces-dir", str(TRACES), "--quiet"]) == 2
    assert "unknown trace" in capsys.readouterr().err
    argv = ["simulate", "--trace", "azure-conv", "--traces-dir", str(TRACES), "--quiet"]
    assert main([*argv, "--policies", "kvscale,magic"]) == 2
    assert "unknown policies" in capsys.readouterr().err
    assert main([*argv, "--dt", "7"]) == 2
    assert "divide 600" in capsys.readouterr().err
    assert main([*argv, "--lead-in", "-60"]) == 2
    assert "--lead-in must not be negative" in capsys.readouterr().err
    spec = tmp_path / "spec.yaml"
    spec.write_text("spec:\n  model: {name: m}\n")
    assert main([*argv, "--spec", str(spec)]) == 2
    assert "source" in capsys.readouterr().err


def test_mixed_compares_the_three_setups_on_a_short_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kvscale simulate --mixed` runs the capacity_sim bench's mixed comparison; the batch jobs
    are moved into the quarter hour simulated."""
    code = main(
        ["simulate", "--mixed", "--traces-dir", str(TRACES), "--hours", "0.25", "--dt", "5",
         "--batch-at", "0.02,0.05", "--quiet", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "simulate.json").read_text())["mixed"]
    assert [j["submitted_at_h"] for j in report["workload"]["batch"]] == [0.02, 0.05]
    setups = report["setups"]
    assert list(setups) == ["deferral", "all_interactive", "two_pools"]
    served = {s["batch_tokens_served"] for s in setups.values()}
    assert min(served) > 0
    assert setups["deferral"]["valley_tokens_served"] > 0
    assert setups["all_interactive"]["valley_tokens_served"] == 0
    assert len(setups["two_pools"]["peak_replicas"]) == 2
    assert set(report["targets"]) == {
        "gpu_hours_saving_vs_all_interactive", "interactive_slo_minutes_fraction",
        "missed_deadlines", "gpu_hours_vs_two_pools",
    }  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("mixed: 0.25 h") and "all_interactive" in out
    argv = ["simulate", "--mixed", "--traces-dir", str(TRACES), "--quiet"]
    assert main([*argv, "--batch-at", "9"]) == 2
    assert "--batch-at" in capsys.readouterr().err
    assert main(["simulate", "--traces-dir", str(TRACES), "--quiet"]) == 2
    assert "--trace is required" in capsys.readouterr().err
