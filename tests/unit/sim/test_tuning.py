"""Tuned baselines: each knob's sweep holds its default, the pick is the cheapest setting that met
the goal on the tuning window (never judged on the part it is scored on), and the HPA metrics."""

from __future__ import annotations

import json
from pathlib import Path

from sim_helpers import TRACES

from kvscale.cli import main
from kvscale.signals.snapshot import Fleet, ReplicaSignals, Snapshot
from kvscale.sim import tuning
from kvscale.sim.policies import HPA
from kvscale.sim.tuning import Outcome, Part, Setting
from kvscale_cluster.specs import llm_spec

SPEC = llm_spec(engine={"maxNumSeqs": 200}, scaling={"maxReplicas": 40})


def test_every_sweep_holds_one_default_the_old_fixed_setting() -> None:
    defaults = {
        b: [s.value for s in tuning.sweep(b, SPEC, 12, 8000.0) if s.default] for b in tuning.KNOBS
    }
    assert defaults == {
        "static": [12],
        "reactive": [0.5],
        "hpa": [140.0],  # 0.7 x maxNumSeqs running per replica: the old 70% utilization
        "hpa-kv": [0.7],
        "keda": [5.0],
        "keda-tokens": [8000.0],  # what plan writes as the replica's capacity
    }
    static = [s.value for s in tuning.sweep("static", SPEC, 12, 8000.0)]
    assert static[0] == 4 and static[-1] == 15 and len(static) >= 6


def outcome(value: float, tune: tuple[float, float], judged: tuple[float, float]) -> Outcome:
    part = Part(tune[0], tune[1], 60)
    return Outcome(Setting("keda", value), part, Part(judged[0], judged[1], 180), part)


def test_the_pick_is_the_cheapest_that_met_the_goal_on_the_tuning_window_only() -> None:
    sweep = [
        outcome(10, (1.0, 0.95), (3.0, 1.0)),  # cheap but missed the goal while tuning
        outcome(5, (2.0, 0.99), (9.0, 0.90)),  # met it: picked, whatever it does later
        outcome(1, (4.0, 1.0), (7.0, 1.0)),
    ]
    pick = tuning.pick(sweep)
    assert pick is not None and pick.setting.value == 5
    assert tuning.pick(sweep[:1]) is None


def test_the_tuning_window_is_servegens_day_one_or_a_quarter() -> None:
    assert tuning.tuning_minutes("servegen-m-large", 14 * 1440) == 1440
    assert tuning.tuning_minutes("servegen-m-large", 600) == 150
    assert tuning.tuning_minutes("azure-conv", 240) == 60


def test_hpa_averages_its_metric_over_ready_replicas() -> None:
    reps = tuple(
        ReplicaSignals(pod=f"p{i}", kv_usage=0.6, prompt_tokens_per_s=3000.0, running=3)
        for i in range(4)
    )
    snap = Snapshot(taken_at=0.0, window_s=15.0, replicas=reps, fleet=Fleet(current=4, ready=4))
    assert HPA("kv", 1, 40, 0.3, "kv").decide(snap, 0.0).desired == 8  # 0.6 / 0.3 x 4
    assert HPA("tok", 1, 40, 2000.0, "tokens").decide(snap, 0.0).desired == 6
    assert HPA("run", 1, 40, 2.0, "running").decide(snap, 0.0).desired == 6
    assert HPA("wait", 1, 40, 5.0, "waiting").decide(snap, 0.0).desired == 1  # none waiting


def test_simulate_tune_reports_the_sweep_the_pick_and_a_pareto_plot(tmp_path: Path) -> None:
    code = main(
        ["simulate", "--trace", "azure-conv", "--traces-dir", str(TRACES), "--hours", "0.25",
         "--rate-scale", "8", "--dt", "5", "--policies", "kvscale,keda,oracle", "--tune",
         "--quiet", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "simulate.json").read_text())["traces"]["azure-conv"]
    tuned = report["tuning"]
    keda = tuned["baselines"]["keda"]
    assert [o["value"] for o in keda["sweep"]] == list(tuning.WAITING)
    assert [o["default"] for o in keda["sweep"]].count(True) == 1 and keda["default_value"] == 5
    assert tuned["window_minutes"] == 4 and tuned["kvscale"]["judged"]["minutes"] == 11
    assert "keda" in report["policies"]  # the default, under the baseline's own name
    assert (tmp_path / "azure-conv-pareto.png").stat().st_size > 0
    # the causal reference: the cheapest follower of each window meets the goal, and the reported
    # one is the cheapest of them
    ref = report["causal_reference"]
    assert ref["lag_minutes"] == 2  # a 60 s interval and the profile's 61 s start-up
    followers = ref["followers"]
    assert {f["window"] for f in followers} <= {1, 3, 5} and followers
    assert all(f["slo_minutes_fraction"] >= 0.99 and f["lag"] == 2 for f in followers)
    assert ref["cheapest"] == min(followers, key=lambda f: f["gpu_hours"])
