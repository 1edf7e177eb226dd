"""The capacity law with deferrable work: spare capacity first, replicas only when deadlines
require them, and no scale-in while the deferred backlog needs the replica.

The plant is `capacity_plant`'s endpoint with a router that holds deferred work earliest deadline
first and releases it into what interactive demand leaves of the ready replicas' capacity; the
law sees the backlog as the routers export it (tokens due within each bucket's seconds).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import pytest
from capacity_plant import Plant, spec

from kvscale.controllers.capacity import CapacityLaw, Decision
from kvscale.controllers.deferred import required_tokens_per_s
from kvscale.signals.snapshot import DeferredBacklog, Fleet, Latency, ReplicaSignals, Snapshot

# the routers' buckets (kvscale_router_deferred_queue_tokens{due_within=...})
DUE_WITHIN = (60.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0)
DUE_WITHIN += (float("inf"),)


@dataclass
class DeferredPlant(Plant):
    held: list[tuple[float, float]] = field(default_factory=list)  # (due at, tokens), EDF
    missed: int = 0

    def submit(self, tokens: float, now: float, deadline_s: float) -> None:
        self.held = sorted([*self.held, (now + deadline_s, tokens)])

    def tick(self, interactive: float, now: float, interval: float) -> DeferredBacklog:
        """One interval: interactive first, then deferred work into what is left (EDF)."""
        ready = sum(1 for p in self.pods if self._ready(p, now))
        spare = max(0.0, ready * self.capacity - interactive) * interval
        served = 0.0
        while self.held and spare > 0:
            due, tokens = self.held[0]
            take = min(tokens, spare)
            spare -= take
            served += take
            self.held[0] = (due, tokens - take)
            if self.held[0][1] <= 1e-6:
                self.missed += now + interval > due
                self.held.pop(0)
        self.missed += sum(1 for due, _ in self.held if due < now)
        self.held = [(due, tokens) for due, tokens in self.held if due >= now]
        end = now + interval
        due = tuple((h, sum(t for d, t in self.held if d - end <= h)) for h in DUE_WITHIN)
        return DeferredBacklog("batch", len(self.held), None, due, served / interval)


def run_mixed(
    interactive: list[float],
    bursts: dict[int, tuple[float, float]],  # interval -> (tokens, deadline seconds)
    plant: DeferredPlant,
    start: int,
) -> list[Decision]:
    endpoint = spec(maxReplicas=20)
    interval = float(endpoint.scaling.capacity_interval_seconds)
    plant.apply(start, -1e6)
    law = CapacityLaw()
    decisions = []
    for i, demand in enumerate(interactive):
        now = i * interval
        if i in bursts:
            plant.submit(*bursts[i][:1], now, bursts[i][1])
        backlog = plant.tick(demand, now, interval)
        snap = plant.observe(demand + backlog.served_tokens_per_s, now, interval)
        decision = law.decide(replace(snap, deferred=(backlog,)), endpoint, now)
        decisions.append(decision)
        plant.apply(decision.desired, now)
    return decisions


def counts(decisions: list[Decision]) -> list[int]:
    return [d.desired for d in decisions]


def test_the_required_rate_is_the_largest_over_the_deadline_horizons() -> None:
    near = DeferredBacklog("a", due=((60.0, 0.0), (3600.0, 360_000.0), (float("inf"), 360_000.0)))
    far = DeferredBacklog("b", due=((300.0, 60_000.0), (float("inf"), 1_000_000.0)))
    # within 300 s: 60k (b); within 3600 s: 360k + 60k; everything by the day's limit
    assert required_tokens_per_s([near, far]) == pytest.approx(
        max(60_000 / 300, 420_000 / 3600, 1_360_000 / 86_400)
    )
    assert required_tokens_per_s([]) == 0.0
    assert required_tokens_per_s([DeferredBacklog("c")]) == 0.0


def test_a_far_deadline_burst_in_a_quiet_phase_fills_the_valley_without_a_replica() -> None:
    plant = DeferredPlant()
    # two replicas carry 300 tokens/s of chat; a 2M-token batch due in four hours arrives
    decisions = run_mixed([300.0] * 60, {5: (2_000_000.0, 14_400.0)}, plant, start=2)
    assert max(counts(decisions)) == 2
    assert "DeadlinesRequire" not in {d.reason for d in decisions}
    assert not plant.held and plant.missed == 0  # it was served from the spare capacity


def test_the_same_burst_with_a_tight_deadline_adds_replicas() -> None:
    plant = DeferredPlant()
    decisions = run_mixed([300.0] * 30, {5: (2_000_000.0, 600.0)}, plant, start=2)
    assert counts(decisions)[:5] == [2] * 5
    # 2M tokens in 600 s is 3333 tokens/s beyond the chat's 360 with headroom: four replicas
    assert decisions[5].reason == "DeadlinesRequire"
    assert counts(decisions)[5] >= 4
    assert "deferred work due at" in decisions[5].message
    assert plant.missed == 0 and not plant.held


def test_scale_in_waits_while_the_deferred_backlog_needs_the_replica() -> None:
    plant = DeferredPlant()
    # a busy hour on five replicas ends as an 8M-token batch due within the hour arrives: the
    # chat alone would fit on one replica, but the batch needs about 2.2 more at its deadline
    interactive = [4000.0] * 10 + [200.0] * 80
    decisions = run_mixed(interactive, {10: (8_000_000.0, 3600.0)}, plant, start=5)
    held = [i for i, d in enumerate(decisions) if d.reason == "DeadlinesHold"]
    assert held, [d.reason for d in decisions]
    for d in decisions[10:]:
        floor = (200.0 * 1.2 + d.deferred_tokens_per_s) / 1000.0
        assert d.desired >= floor
    assert plant.missed == 0 and not plant.held
    # once the batch is served the endpoint steps down one replica per interval to one
    assert counts(decisions)[-1] == 1
    after = counts(decisions)[held[-1] :]
    assert all(a - b <= 1 for a, b in itertools.pairwise(after))


def _busy(
    i: int, waiting: float, deferred_waiting: float, preempted: float, ttft: float
) -> Snapshot:
    """Two replicas at 600 tokens/s each; `waiting` requests per replica, `deferred_waiting` of
    them deferred; `preempted` preemptions/s per replica, all of deferred work; the interactive
    classes' p99 TTFT (the engines' histogram leaves deferred work out)."""
    reps = tuple(
        ReplicaSignals(
            pod=f"p{j}",
            prompt_tokens_per_s=500.0,
            generation_tokens_per_s=100.0,
            running=4,
            waiting=waiting,
            kv_usage=0.5,
            preemptions_per_s=preempted,
            successes_per_s=1.0,
            created_at=0.0,
            deferred_waiting=deferred_waiting,
            deferred_preemptions_per_s=preempted,
        )
        for j in range(2)
    )
    return Snapshot(
        taken_at=i * 60.0,
        window_s=60.0,
        replicas=reps,
        latency=Latency(ttft_p99=ttft, itl_p99=0.05),
        fleet=Fleet(current=2, ready=2, startup_seconds=60.0),
    )


@pytest.mark.parametrize(
    ("interactive", "ttft", "panic"),
    [(0.0, 0.5, None), (1.0, 0.5, {"QueueGrowing"}), (1.0, 5.0, {"QueueGrowing", "TTFTAboveSLO"})],
    ids=["deferred-only", "interactive-queue", "interactive-slow"],
)
def test_deferred_work_waiting_and_preempted_is_no_panic(
    interactive: float, ttft: float, panic: set[str] | None
) -> None:
    """Released deferred work waits behind interactive requests and is preempted by them: by
    design, so the law holds its replicas; the same queue of interactive requests is trouble."""
    endpoint = spec(maxReplicas=20)
    history = [_busy(i, 0.0, 0.0, 0.0, 0.5) for i in range(3)]
    history += [_busy(3 + i, interactive * (i + 1) + 2.0 * (i + 1), 2.0 * (i + 1), i + 1.0, ttft)
                for i in range(3)]  # fmt: skip
    law = CapacityLaw()
    reasons = [law.decide(s, endpoint, s.taken_at).reason for s in history]
    if panic is None:
        assert set(reasons) <= {"Stable", "StabilizingDown"}, reasons
        assert law.state.desired == 2
    else:
        assert reasons[3] in panic, reasons
        assert law.state.desired is not None and law.state.desired > 2


def test_released_work_waiting_in_the_engines_is_due_within_an_interval() -> None:
    """Deferred work the routers released waits in the engines (forced out near its deadline):
    it is cleared within one interval at a held request's tokens, and adds a replica only as
    deadline work (DeadlinesRequire), never as a panic."""
    endpoint = spec(maxReplicas=20)
    held = DeferredBacklog("batch", 1, 30.0, ((60.0, 0.0), (float("inf"), 2000.0)))
    calm = replace(_busy(0, 0.0, 0.0, 0.0, 0.5), deferred=(held,))
    law = CapacityLaw()
    for i in range(3):
        law.decide(replace(calm, taken_at=i * 60.0), endpoint, i * 60.0)
    # 2 x 10 released requests of 2000 tokens within 60 s: 667 tokens/s beside 1440 of chat
    waiting = replace(_busy(3, 10.0, 10.0, 0.0, 0.5), deferred=(held,))
    decision = law.decide(waiting, endpoint, waiting.taken_at)
    assert decision.deferred_tokens_per_s == pytest.approx(20 * 2000 / 60 + 2000 / 86_400)
    assert (decision.desired, decision.reason) == (3, "DeadlinesRequire")
