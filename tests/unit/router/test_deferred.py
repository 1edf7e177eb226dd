"""The deferred queue: earliest deadline first, bounded, refusing what cannot make its deadline,
releasing into spare capacity only (never to a hot replica) unless a deadline forces it."""

from __future__ import annotations

import math

import pytest

from kvscale_router.deferred import (
    DUE_BUCKETS_S,
    DeferralPolicy,
    Deferred,
    DeferredQueue,
    Plan,
    QueueFull,
    RateEstimate,
    Rates,
    Room,
    Unmeetable,
)

POLICY = DeferralPolicy(safety=2.0, margin_s=5.0, prior_tokens_per_s=10.0)
SPARE = Room(outstanding=0.0, budget=1000.0, rate=10.0)
HOT = Room(outstanding=0.0, budget=0.0, rate=10.0)


def request(deadline: float, tokens: float = 100.0, output: int = 50, cls: str = "batch",
            arrival: float = 0.0) -> Deferred:  # fmt: skip
    return Deferred(cls, arrival, deadline, tokens, output)


def queue(bound: int = 10, **bounds: int) -> DeferredQueue:
    return DeferredQueue({"batch": bound, **bounds}, POLICY)


def test_releases_go_earliest_deadline_first_ties_by_arrival() -> None:
    q = queue()
    late, early, early_too = request(3600), request(600), request(600)
    for r in (late, early, early_too):
        q.push(r, now=0.0, best_rate=10.0)
    assert q.earliest_first() == [early, early_too, late]
    # room for two: the two earliest deadlines go, the latest stays
    plan = q.plan(1.0, {"a": Room(0.0, 200.0, 10.0)}, interactive_waiting=False)
    assert [r.request for r in plan.releases] == [early, early_too]
    assert {r.reason for r in plan.releases} == {"spare"} and list(q.earliest_first()) == [late]


def test_the_queue_is_bounded_per_class() -> None:
    q = queue(bound=2, other=1)
    q.push(request(600), 0.0, 10.0)
    q.push(request(600), 0.0, 10.0)
    with pytest.raises(QueueFull):
        q.push(request(600), 0.0, 10.0)
    q.push(request(600, cls="other"), 0.0, 10.0)  # another class has its own bound
    assert len(q) == 3


def test_a_deadline_the_fastest_replica_cannot_meet_is_refused_at_arrival() -> None:
    q = queue()
    with pytest.raises(Unmeetable):  # 500 tokens at 10/s take 50 s, the deadline is in 30 s
        q.push(request(30, output=500), now=0.0, best_rate=10.0)
    q.push(request(30, output=500), now=0.0, best_rate=20.0)  # 25 s on a faster replica
    assert len(q) == 1


def test_a_queued_request_that_can_no_longer_make_it_is_given_up_not_sent_late() -> None:
    q = queue()
    r = request(100, output=500)  # 50 s at the prior 10/s
    q.push(r, 0.0, 10.0)
    # no replica routable (scaling from zero): it waits while it still can make it
    assert q.plan(20.0, {}, interactive_waiting=False) == Plan([], [])
    plan = q.plan(60.0, {}, interactive_waiting=False)  # 60 + 50 > 100
    assert plan.unmeetable == [r] and plan.releases == [] and len(q) == 0
    # the replicas turned out slower than thought: 500 tokens at 5/s no longer fit in 100 s
    r = request(100, output=500)
    q.push(r, 0.0, 10.0)
    assert q.plan(1.0, {"a": Room(0.0, 1000.0, 5.0)}, True).unmeetable == [r]


def test_spare_capacity_takes_work_only_within_each_replicas_budget() -> None:
    q = queue()
    for _ in range(5):
        q.push(request(3600, tokens=300), 0.0, 10.0)
    rooms = {"a": Room(400.0, 1000.0, 10.0), "b": Room(0.0, 1000.0, 10.0)}
    plan = q.plan(1.0, rooms, interactive_waiting=False)
    # a has room for 2 x 300 (400 -> 1000), b for 3 x 300 (0 -> 900): all 5 go, none over budget
    placed = [r.replica for r in plan.releases]
    assert sorted(placed) == ["a", "a", "b", "b", "b"] and len(q) == 0
    # a full replica takes nothing
    q.push(request(3600, tokens=300), 0.0, 10.0)
    assert q.plan(1.0, {"a": Room(900.0, 1000.0, 10.0)}, False).releases == []


def test_interactive_requests_go_first() -> None:
    q = queue()
    q.push(request(3600), 0.0, 10.0)
    assert q.plan(1.0, {"a": SPARE}, interactive_waiting=True).releases == []
    assert len(q.plan(2.0, {"a": SPARE}, interactive_waiting=False).releases) == 1


def test_a_hot_replica_gets_no_deferred_work() -> None:
    q = queue()
    for _ in range(3):
        q.push(request(3600), 0.0, 10.0)
    plan = q.plan(1.0, {"hot": HOT, "cool": SPARE}, interactive_waiting=False)
    assert {r.replica for r in plan.releases} == {"cool"}
    q.push(request(3600), 0.0, 10.0)
    assert q.plan(1.0, {"hot": HOT}, interactive_waiting=False).releases == []
    # even a deadline goes to a full replica that is not hot rather than to the hot one
    due = request(200, output=50)  # latest start: 200 - 5 - 2 x 5 = 185
    q.push(due, 0.0, 10.0)
    full = Room(5000.0, 1000.0, 10.0)
    plan = q.plan(185.0, {"hot": HOT, "full": full}, interactive_waiting=True)
    assert [(r.request, r.replica, r.reason) for r in plan.releases] == [(due, "full", "deadline")]


def test_a_deadline_releases_a_request_however_loaded_the_replicas_are() -> None:
    q = queue()
    r = request(200, output=50)  # 5 s of decoding at 10/s: latest start 200 - 5 - 10 = 185
    q.push(r, 0.0, 10.0)
    busy = {"a": Room(5000.0, 1000.0, 10.0), "b": Room(8000.0, 0.0, 10.0)}
    assert q.plan(184.0, busy, interactive_waiting=True).releases == []
    assert q.next_due(busy) == pytest.approx(185.0)
    plan = q.plan(185.0, busy, interactive_waiting=True)
    assert [(x.replica, x.reason) for x in plan.releases] == [("a", "deadline")]
    # with every replica hot, the deadline still wins: the least loaded over its budget takes it
    q.push(request(400, output=50), 200.0, 10.0)
    both_hot = {"a": Room(9000.0, 0.0, 10.0), "b": Room(100.0, 0.0, 10.0)}
    assert [x.replica for x in q.plan(385.0, both_hot, True).releases] == ["b"]
    # a slow replica brings the latest start forward (the slowest rate is assumed)
    q.push(request(400, output=50), 200.0, 10.0)
    slow = {"a": Room(9000.0, 1000.0, 2.0)}  # 25 s: latest start 400 - 5 - 50 = 345
    assert [x.reason for x in q.plan(345.0, slow, True).releases] == ["deadline"]


def test_nothing_is_released_while_no_replica_is_routable() -> None:
    q = queue()
    q.push(request(100, output=10), 0.0, 10.0)
    assert q.plan(99.0, {}, interactive_waiting=False).releases == []
    assert len(q) == 1


def test_a_class_at_its_concurrency_limit_waits() -> None:
    q = queue(other=10)
    for cls in ("batch", "batch", "other"):
        q.push(request(3600, cls=cls), 0.0, 10.0)
    plan = q.plan(1.0, {"a": SPARE}, False, slots={"batch": 1, "other": None})
    assert sorted(r.request.traffic_class for r in plan.releases) == ["batch", "other"]
    assert [r.traffic_class for r in q.earliest_first()] == ["batch"]


def test_a_valley_is_no_interactive_wait_and_every_replica_spare() -> None:
    for rooms, waiting, valley in [
        ({"a": SPARE, "b": Room(500.0, 1000.0, 10.0)}, False, True),
        ({"a": SPARE, "b": Room(1000.0, 1000.0, 10.0)}, False, False),  # b at its budget
        ({"a": SPARE, "b": HOT}, False, False),
        ({"a": SPARE}, True, False),
    ]:
        q = queue()
        q.push(request(3600), 0.0, 10.0)
        plan = q.plan(1.0, rooms, interactive_waiting=waiting)
        assert all(r.valley == valley for r in plan.releases), rooms


def test_remove_takes_a_request_out_once() -> None:
    q = queue(bound=1)
    r = request(600)
    q.push(r, 0.0, 10.0)
    assert q.remove(r) and not q.remove(r) and r not in q
    q.push(request(600), 0.0, 10.0)  # its place is free again
    assert q.plan(1.0, {"a": SPARE}, False).releases[0].request is not r


def test_backlog_counts_tokens_by_due_time_cumulatively() -> None:
    q = queue(other=5)
    q.push(request(30, tokens=10, arrival=0.0), 0.0, 1000.0)
    q.push(request(1000, tokens=100, arrival=5.0), 5.0, 1000.0)
    q.push(request(20000, tokens=1000, arrival=8.0), 8.0, 1000.0)
    backlog = q.backlog(10.0, ["batch", "other"])
    batch = backlog["batch"]
    assert batch.requests == 3 and batch.oldest_age_s == pytest.approx(10.0)
    assert [batch.tokens_due[b] for b in DUE_BUCKETS_S] == [10] * 4 + [110] * 4 + [1110] * 3
    assert DUE_BUCKETS_S[-1] == math.inf
    assert backlog["other"].requests == 0 and backlog["other"].tokens_due[math.inf] == 0


def test_the_rate_starts_at_the_prior_and_learns_cautiously() -> None:
    estimate = RateEstimate(prior_tokens_per_s=10.0)
    assert estimate.tokens_per_s == 10.0
    estimate.observe(100, 1.0)  # one fast request: 100 tokens/s
    assert 10.0 < estimate.tokens_per_s < 20.0
    for _ in range(50):
        estimate.observe(1000, 10.0)
    assert 70.0 < estimate.tokens_per_s < 100.0  # the prior keeps it below what was seen
    estimate.observe(0, 1.0)  # nothing generated (an abort): no evidence
    rates = Rates(prior_tokens_per_s=10.0)
    rates.observe("a", 500, 5.0)
    assert rates.of("b") == 10.0 and rates.of("a") > 10.0
    rates.forget(["a"])
    assert rates.of("a") == 10.0


def test_policy_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        DeferralPolicy(safety=0.5)
    with pytest.raises(ValueError):
        DeferralPolicy(prior_tokens_per_s=0.0)
