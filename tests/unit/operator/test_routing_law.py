"""The routing-weights law walked through scripted signal histories, plus its invariants."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale.controllers import routing
from kvscale.controllers.routing import RoutingParams, RoutingState, decide
from kvscale.signals.snapshot import Latency, ReplicaSignals

PODS = ("a", "b", "c")


def idle(pod: str, **extra: float) -> ReplicaSignals:
    return ReplicaSignals(pod=pod, running=2.0, kv_usage=0.3, **extra)  # type: ignore[arg-type]


def hot(pod: str) -> ReplicaSignals:
    return ReplicaSignals(pod=pod, running=8.0, waiting=24.0, kv_usage=0.95)


Tick = Callable[[int], Sequence[ReplicaSignals]]


def trajectory(
    ticks: int,
    signals: Tick,
    warming: Callable[[int], dict[str, float]] = lambda _: {},
    draining: Callable[[int], set[str]] = lambda _: set(),
    pods: Sequence[str] = PODS,
) -> list[routing.RoutingDecision]:
    state, out = RoutingState(), []
    for t in range(ticks):
        decision = decide(pods, signals(t), warming(t), draining(t), state)
        out.append(decision)
        state = decision.state
    return out


def weights_of(run: list[routing.RoutingDecision], pod: str) -> list[float]:
    return [d.weights[pod] for d in run]


def test_even_load_gives_everyone_full_weight() -> None:
    run = trajectory(5, lambda _: [idle(p) for p in PODS])
    assert all(d.weights == {"a": 1.0, "b": 1.0, "c": 1.0} for d in run)
    assert run[-1].reason == routing.BALANCED


def test_hot_replica_drops_within_one_tick_and_recovers_slowly() -> None:
    def signals(t: int) -> list[ReplicaSignals]:
        return [hot("a") if 2 <= t < 5 else idle("a"), idle("b"), idle("c")]

    run = trajectory(14, signals)
    a = weights_of(run, "a")
    assert a[:2] == [1.0, 1.0]
    assert a[2] < 0.5 and run[2].reason == routing.HOT  # the first hot tick already sheds load
    assert a[4] <= a[3] <= a[2]
    rising = a[5:]
    assert all(x <= y for x, y in itertools.pairwise(rising))  # monotone recovery
    assert a[5] < 0.8  # slow rise: one calm tick does not restore the full share
    assert a[-1] == 1.0
    assert weights_of(run, "b") == [1.0] * 14


def test_warming_pods_ramp_up_and_draining_pods_get_zero() -> None:
    run = trajectory(
        6,
        lambda _: [idle(p) for p in PODS],
        warming=lambda t: {"c": t / 3} if t < 3 else {},
        draining=lambda t: {"a"} if t >= 4 else set(),
    )
    c, a = weights_of(run, "c"), weights_of(run, "a")
    assert c == [0.1, 0.4, 0.7, 1.0, 1.0, 1.0]  # a slow start, then its full target once warm
    assert a == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert run[0].reason == routing.WARMING and run[4].reason == routing.DRAINING
    assert "c at 0.10" in run[0].message


def test_a_warming_pod_takes_load_from_a_hot_peer_at_once() -> None:
    """A new replica beside an overloaded one gets a share on its first tick, not after the
    warm-up: holding it at 0 would keep every new request on the replica that is refusing."""
    d = decide(("a", "b"), [hot("a"), idle("b")], {"b": 0.0}, (), RoutingState())
    assert d.weights["b"] == 0.1 and d.weights["a"] < 0.2  # b takes a third of new work
    assert d.state.weights["b"] == 0.0  # warm, it joins at its full target, unsmoothed
    warm = decide(("a", "b"), [hot("a"), idle("b")], {}, (), d.state)
    assert warm.weights["b"] == 1.0


def test_pod_without_signals_keeps_serving() -> None:
    run = trajectory(3, lambda _: [idle("a")], pods=("a", "b"))
    assert weights_of(run, "b") == [1.0, 1.0, 1.0]
    quiet = trajectory(2, lambda _: [], pods=("a",))
    assert quiet[-1].weights == {"a": 1.0} and quiet[-1].reason == routing.NO_SIGNALS


def test_slow_ttft_against_the_slo_lowers_the_weight() -> None:
    slow = ReplicaSignals(pod="a", running=2.0, latency=Latency(ttft_p99=3.0))
    fast = ReplicaSignals(pod="b", running=2.0, latency=Latency(ttft_p99=0.5))
    params = RoutingParams(ttft_slo_s=1.0)
    d = decide(("a", "b"), [slow, fast], (), (), RoutingState(), params)
    assert d.weights["a"] < 0.5 < d.weights["b"] == 1.0


def test_preemptions_lower_the_weight() -> None:
    d = decide(("a", "b"), [idle("a", preemptions_per_s=2.0), idle("b")], (), (), RoutingState())
    assert d.weights["a"] < 0.5 and d.weights["b"] == 1.0


def test_state_round_trips_and_survives_garbage() -> None:
    state = RoutingState({"b": 0.5, "a": 1.0})
    assert RoutingState.from_dict(state.to_dict()) == state
    assert RoutingState.from_dict(None) == RoutingState()
    assert RoutingState.from_dict({"weights": {"a": "nan", "b": 7}}).weights == {"b": 1.0}


def test_no_pods_is_explained() -> None:
    d = decide((), [], (), (), RoutingState())
    assert d.weights == {} and d.reason == routing.NO_REPLICAS


signal_st = st.builds(
    ReplicaSignals,
    pod=st.sampled_from(PODS),
    running=st.floats(0, 64),
    waiting=st.floats(0, 256),
    kv_usage=st.floats(0, 1),
    preemptions_per_s=st.floats(0, 50),
    latency=st.builds(Latency, ttft_p99=st.none() | st.floats(0.001, 60)),
)


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(st.lists(signal_st, max_size=3), min_size=1, max_size=8),
    warming=st.dictionaries(st.sampled_from(PODS), st.floats(0, 0.999)),
    draining=st.sets(st.sampled_from(PODS)),
)
def test_weights_are_bounded_and_zero_only_when_draining(
    history: list[list[ReplicaSignals]], warming: dict[str, float], draining: set[str]
) -> None:
    state = RoutingState()
    for signals in history:
        d = decide(PODS, signals, warming, draining, state)
        state = d.state
        assert set(d.weights) == set(PODS)
        assert all(0.0 <= w <= 1.0 for w in d.weights.values())
        assert all(d.weights[p] == 0.0 for p in draining)
        assert all(d.weights[p] > 0.0 for p in set(PODS) - draining)
        assert all(d.weights[p] <= 0.1 + 0.9 * warming[p] + 1e-4 for p in set(warming) - draining)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32), level=st.floats(0, 8), noise=st.floats(0, 0.15))
def test_flat_noisy_load_does_not_oscillate(seed: int, level: float, noise: float) -> None:
    """Same load on every replica, ±noise: after settling, weights stay put."""
    rng = random.Random(seed)

    def signals(_: int) -> list[ReplicaSignals]:
        return [
            ReplicaSignals(
                pod=p,
                running=8.0,
                waiting=level * (1 + rng.uniform(-noise, noise)),
                kv_usage=0.5,
            )
            for p in PODS
        ]

    run = trajectory(40, signals)
    for pod in PODS:
        w = weights_of(run, pod)[5:]
        flips = sum(1 for x, y, z in zip(w, w[1:], w[2:], strict=False) if (y - x) * (z - y) < 0)
        assert flips <= 2, w
        assert min(w) >= 0.75


@settings(max_examples=100, deadline=None)
@given(waiting=st.floats(4, 500), others=st.floats(0, 1))
def test_the_hot_replica_drops_below_its_peers(waiting: float, others: float) -> None:
    calm = [ReplicaSignals(pod=p, running=4.0, waiting=others) for p in ("b", "c")]
    before = decide(PODS, [idle("a"), *calm], (), (), RoutingState())
    after = decide(
        PODS, [ReplicaSignals(pod="a", running=4.0, waiting=waiting), *calm], (), (), before.state
    )
    assert after.weights["a"] < before.weights["a"]
    assert after.weights["a"] < min(after.weights["b"], after.weights["c"])


def test_without_an_slo_small_ttft_differences_are_noise() -> None:
    quick = ReplicaSignals(pod="a", running=1.0, latency=Latency(ttft_p99=0.005))
    slower = ReplicaSignals(pod="b", running=1.0, latency=Latency(ttft_p99=0.02))
    stuck = ReplicaSignals(pod="c", running=1.0, latency=Latency(ttft_p99=4.0))
    d = decide(PODS, [quick, slower, stuck], (), (), RoutingState())
    assert d.weights["a"] == d.weights["b"] == 1.0  # 4x, but 15 ms apart
    assert d.weights["c"] < 0.5


def test_publication_is_the_configmap_format_the_router_reads() -> None:
    d = decide(("a", "b"), [], (), {"b"}, RoutingState())
    text = routing.publication(d, 0.0)
    assert json.loads(text) == {
        "weights": {"a": 1.0, "b": 0.0},
        "updatedAt": "1970-01-01T00:00:00Z",
        "reason": routing.DRAINING,
    }


def test_token_budgets_follow_the_capacity_the_slo_and_the_weight() -> None:
    params = RoutingParams(ttft_slo_s=1.5, replica_tokens_per_s=4000.0)
    calm = [idle(p) for p in PODS]
    d = decide(("a", "b", "c", "d"), calm, (), {"d"}, RoutingState(), params)
    assert d.token_budgets == {"a": 6000.0, "b": 6000.0, "c": 6000.0, "d": 0.0}
    d = decide(("a", "b", "c", "d"), [*calm[:2], hot("c")], (), {"d"}, d.state, params)
    assert d.token_budgets["c"] == round(d.weights["c"] * 6000.0) < 3000.0
    assert json.loads(routing.publication(d, 0.0))["tokenBudgets"] == d.token_budgets
    # without a capacity (an endpoint without deferrable classes) none is published
    d = decide(("a",), calm[:1], (), (), RoutingState(), RoutingParams(ttft_slo_s=1.5))
    assert d.token_budgets == {} and "tokenBudgets" not in json.loads(routing.publication(d, 0))
