"""One law, one history: the operator's capacity loop and the simulator hold the same
`CapacityLaw`, so one recorded snapshot sequence gets identical decisions through both paths, and
the history each keeps is the spec's scale-down window, not a caller's cap (the simulator used
to hand the law at most 64 snapshots: 640 s at a 10 s interval against a 1800 s window)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import httpx
from sim_helpers import TRACES, profile

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.capacity_loop import CapacityLoop, Tick
from kvscale.context import Context
from kvscale.controllers.capacity import CapacityState, decide, history_length
from kvscale.operator_metrics import OperatorMetrics
from kvscale.signals.snapshot import Snapshot
from kvscale.sim.arrivals import open_workload
from kvscale.sim.policies import Choice, Kvscale
from kvscale.sim.run import Settings, simulate
from kvscale_cluster.specs import spec_body

SCALING = {
    "minReplicas": 1,
    "maxReplicas": 12,
    "capacityIntervalSeconds": 10,
    "scaleDownStabilizationSeconds": 1800,
    "replicaCapacityTokensPerSecond": 4000,
}
BODY = spec_body(scaling=SCALING)
SPEC = LLMEndpointSpec.model_validate(BODY)


@dataclass
class Recorded:
    """kvscale's policy, keeping every snapshot it was handed with the time it decided."""

    inner: Kvscale
    name: str = "recorded"
    instant: bool = False
    seen: list[tuple[Snapshot, float, Choice]] = field(default_factory=list)

    @property
    def interval_s(self) -> float:
        return self.inner.interval_s

    def decide(self, snap: Snapshot, now: float) -> Choice:
        choice = self.inner.decide(snap, now)
        self.seen.append((snap, now, choice))
        return choice


class NoKube:
    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        pass


class NoSource:
    def forget(self, namespace: str, endpoint: str) -> None:
        pass


def test_history_covers_the_scale_down_window() -> None:
    assert history_length(SPEC) == 182  # 1800 s / 10 s + 2
    assert history_length(LLMEndpointSpec.model_validate(spec_body())) >= 12  # 600 s floor


async def test_a_recorded_sequence_gets_identical_decisions_from_operator_and_simulator() -> None:
    wl = open_workload("azure-conv", TRACES, hours=0.6, rate_scale=6.0)
    recorded = Recorded(Kvscale(SPEC))
    simulate(wl, SPEC, profile(), recorded, 2, Settings(dt_s=2.0))
    seen = recorded.seen
    assert len(seen) > 200 and len({c.desired for _, _, c in seen}) > 1  # it did scale

    replay = Kvscale(SPEC)  # the simulator's path, on the recording
    sim = [replay.decide(snap, now) for snap, now, _ in seen]
    assert sim == [c for _, _, c in seen]

    source: Any = NoSource()
    ctx = Context(kube=cast(Any, NoKube()), source=lambda _: source, metrics=OperatorMetrics())
    admin = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    loop = CapacityLoop(ctx, "ns", "chat", admin=admin)
    operator = []
    for snap, now, _ in seen:  # the operator's path: its capacity loop's decision step
        status = (await loop._decide({"spec": BODY}, SPEC, snap, now, Tick())).status
        operator.append((status["capacity"]["desired"], status["capacity"]["reason"]))
    assert operator == [(c.desired, c.reason) for c in sim]
    assert loop.law is not None and replay.law is not None
    assert loop.law.state == replay.law.state
    assert len(loop.law.history) == len(replay.law.history) == history_length(SPEC) > 64

    # what the simulator did before: the same law on at most 64 snapshots decides otherwise
    capped, state, history = [], CapacityState(desired=seen[0][0].fleet.current), []
    for snap, now, _ in seen:
        history = [*history, snap][-64:]
        d = decide(history, SPEC, state, now)
        state = d.state
        capped.append((d.desired, d.reason))
    assert capped != operator
