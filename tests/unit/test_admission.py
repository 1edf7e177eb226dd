"""Admission control as pure logic: limits, queues, deadlines, priorities, draining, parsing."""

from __future__ import annotations

import pytest

from kvscale_engine.server.admission import (
    AdmissionConfigError,
    AdmissionController,
    KvFootprint,
    TrafficClass,
    derive_concurrency_limit,
    engine_priorities,
    parse_duration_s,
    parse_traffic_classes,
)

INTERACTIVE = TrafficClass("interactive", priority=10, max_queue=2, max_queue_wait_s=2.0)
BATCH = TrafficClass("batch", priority=0, max_queue=10, max_queue_wait_s=60.0)


def controller(
    limit: int | None = 2, *classes: TrafficClass, warm: bool = True
) -> AdmissionController:
    """A controller that has (by default) seen one request hold a slot for 0.1 s."""
    ac = AdmissionController(classes or (INTERACTIVE, BATCH), limit)
    if warm:
        ac.offer(-1, (classes or (BATCH,))[0], -10.0)
        ac.release(-1, -9.9)
    return ac


def test_admits_up_to_the_limit_then_queues_then_refuses_a_full_queue() -> None:
    ac = controller(2)
    assert [ac.offer(t, INTERACTIVE, 0.0).outcome for t in range(5)] == [
        "admit", "admit", "queue", "queue", "reject",
    ]  # fmt: skip
    refused = ac.offer(9, INTERACTIVE, 0.0)
    assert refused.reason == "queue_full" and refused.retry_after_s >= 1
    assert ac.in_flight == 2 and ac.queued == 2


def test_release_starts_the_most_important_waiter_first() -> None:
    ac = controller(1)
    assert ac.offer(0, BATCH, 0.0).outcome == "admit"
    assert ac.offer(1, BATCH, 0.1).outcome == "queue"
    assert ac.offer(2, INTERACTIVE, 0.2).outcome == "queue"
    assert ac.release(0, 1.0) == [2]  # interactive jumps the older batch request
    assert ac.release(2, 2.0) == [1]
    assert ac.release(1, 3.0) == []
    assert ac.in_flight == 0


def test_fifo_within_a_class() -> None:
    ac = controller(1)
    ac.offer(0, BATCH, 0.0)
    for t in (1, 2, 3):
        assert ac.offer(t, BATCH, float(t)).outcome == "queue"
    assert [ac.release(t, 10.0 + t)[0] for t in (0, 1, 2)] == [1, 2, 3]


def test_a_cold_replica_queues_one_wave_then_refuses() -> None:
    # a replica just added for a burst: no request has finished, so no wait can be predicted
    ac = controller(3, warm=False)
    outcomes = [ac.offer(t, BATCH, 0.0) for t in range(7)]
    assert [v.outcome for v in outcomes] == ["admit"] * 3 + ["queue"] * 3 + ["reject"]
    assert outcomes[-1].reason == "queue_full"
    assert ac.release(0, 2.0) == [3]  # the queue drains as the first wave finishes
    for t in (1, 2):
        ac.release(t, 2.0)
    assert ac.queued == 0
    # warm now: the class's own bound (10) applies
    assert [ac.offer(t, BATCH, 2.0).outcome for t in range(10, 14)] == ["queue"] * 4


def test_a_cold_replica_never_queues_past_the_class_bound() -> None:
    ac = controller(3, INTERACTIVE, warm=False)  # maxQueue 2 < one wave of 3
    outcomes = [ac.offer(t, INTERACTIVE, 0.0).outcome for t in range(6)]
    assert outcomes == ["admit"] * 3 + ["queue"] * 2 + ["reject"]


def test_raising_the_limit_starts_queued_requests() -> None:
    ac = controller(1)
    ac.offer(0, BATCH, 0.0)
    ac.offer(1, BATCH, 0.0)
    ac.offer(2, BATCH, 0.0)
    assert ac.set_limit(2, 1.0) == [1]
    assert ac.set_limit(1, 1.0) == []  # lowering stops no one; new work waits
    assert ac.offer(3, BATCH, 1.0).outcome == "queue" and ac.in_flight == 2
    with pytest.raises(AdmissionConfigError):
        ac.set_limit(0, 1.0)


def test_per_class_concurrency_limit() -> None:
    capped = TrafficClass("capped", max_concurrency=1, max_queue=5)
    ac = controller(10, capped, BATCH)
    assert ac.offer(0, capped, 0.0).outcome == "admit"
    assert ac.offer(1, capped, 0.0).outcome == "queue"  # class full, replica not
    assert ac.offer(2, BATCH, 0.0).outcome == "admit"
    assert ac.release(2, 1.0) == []  # a batch slot does not start the capped waiter
    assert ac.release(0, 1.0) == [1]


DEFERRED = TrafficClass("reports", priority=50, max_queue=10, max_queue_wait_s=3600.0,
                        deadline_s=3600.0)  # fmt: skip


def test_a_deferrable_class_ranks_below_every_interactive_one_whatever_its_priority() -> None:
    low = TrafficClass("backfill", priority=-5, deadline_s=14400.0)
    ranks = engine_priorities((INTERACTIVE, BATCH, DEFERRED, low))
    assert ranks["interactive"] == 10 and ranks["batch"] == 0  # interactive classes keep theirs
    assert ranks["batch"] > ranks["reports"] > ranks["backfill"]  # deferrable: below, in order
    assert engine_priorities((DEFERRED,)) == {"reports": -1}
    ac = controller(1, INTERACTIVE, DEFERRED)
    assert ac.priority_of(DEFERRED) < ac.priority_of(INTERACTIVE)


def test_deferred_work_yields_its_places_to_interactive_requests() -> None:
    ac = controller(2, INTERACTIVE, DEFERRED)
    assert [ac.offer(t, DEFERRED, 0.0).outcome for t in range(3)] == ["admit", "admit", "queue"]
    # the limit is reached by deferred work alone: interactive requests are still admitted
    # (the engine preempts deferred work for them), up to the limit of their own
    assert [ac.offer(t, INTERACTIVE, 0.0).outcome for t in (10, 11, 12)] == [
        "admit", "admit", "queue",
    ]  # fmt: skip
    # a freed place goes to the interactive waiter first, even though the deferred one is older
    # and its class's priority number is higher
    assert ac.release(10, 1.0) == [12]
    assert ac.release(0, 1.0) == [] and ac.release(11, 1.0) == []
    assert ac.release(12, 1.0) == [2]


def test_predicted_wait_past_the_deadline_is_refused_at_once() -> None:
    ac = controller(1, warm=False)
    ac.offer(0, INTERACTIVE, 0.0)
    assert ac.predicted_wait_s(INTERACTIVE) == 0.0  # no service time measured yet
    ac.release(0, 1.5)  # one request held its slot for 1.5 s
    ac.offer(1, INTERACTIVE, 2.0)
    assert ac.offer(2, INTERACTIVE, 2.0).outcome == "queue"  # 1.5 s < 80% of 2 s
    assert ac.predicted_wait_s(INTERACTIVE) == pytest.approx(3.0)
    verdict = ac.offer(3, INTERACTIVE, 2.0)  # 3 s > 80% of 2 s
    assert (verdict.outcome, verdict.reason) == ("reject", "deadline")
    assert verdict.retry_after_s == 3.0


def test_the_time_from_a_slot_to_the_first_token_counts_against_the_wait() -> None:
    # the same queue as above, but each request took 0.5 s from its slot to its first token:
    # a predicted 1.5 s in the queue is a first token at 2 s, past 80% of the class's 2 s
    ac = controller(1, warm=False)
    ac.offer(0, INTERACTIVE, 0.0)
    assert ac.first_token_s == 0.0  # nothing measured yet
    ac.release(0, 1.5, first_token_at=0.5)
    assert ac.first_token_s == pytest.approx(0.5)
    ac.offer(1, INTERACTIVE, 2.0)
    verdict = ac.offer(2, INTERACTIVE, 2.0)
    assert (verdict.outcome, verdict.reason) == ("reject", "deadline")
    assert verdict.retry_after_s == 2.0  # the queue's wait, rounded up
    # a request that ended without a first token (aborted while prefilling) teaches nothing
    ac.release(1, 3.0)
    assert ac.first_token_s == pytest.approx(0.5)
    # a batch class's long wait still queues
    assert ac.offer(3, BATCH, 3.0).outcome == "admit"
    assert ac.offer(4, BATCH, 3.0).outcome == "queue"


def test_cancel_removes_a_queued_ticket_only() -> None:
    ac = controller(1)
    ac.offer(0, BATCH, 0.0)
    ac.offer(1, BATCH, 0.0)
    assert ac.cancel(1) is True
    assert ac.cancel(1) is False
    assert ac.cancel(0) is False  # running, not queued
    assert ac.release(0, 1.0) == []


def test_draining_refuses_new_work_but_serves_the_queue() -> None:
    ac = controller(1)
    ac.offer(0, BATCH, 0.0)
    ac.offer(1, BATCH, 0.0)
    ac.start_draining()
    verdict = ac.offer(2, INTERACTIVE, 0.0)
    assert (verdict.outcome, verdict.reason) == ("reject", "draining")
    assert ac.release(0, 1.0) == [1]


def test_unlimited_controller_admits_everything() -> None:
    ac = controller(None)
    assert all(ac.offer(t, BATCH, 0.0).outcome == "admit" for t in range(1000))


def test_unknown_or_missing_class_resolves_to_the_default() -> None:
    ac = controller(2)
    assert ac.resolve(None) is INTERACTIVE
    assert ac.resolve("nope") is INTERACTIVE
    assert ac.resolve("batch") is BATCH
    assert AdmissionController((), 1).resolve(None).name == "default"


@pytest.mark.parametrize(
    ("blocks", "block_size", "max_len", "max_seqs", "expected"),
    [
        (256, 16, 512, 256, 8),  # 8 requests of 512 tokens fill 256 blocks of 16
        (256, 16, 500, 256, 8),  # 500 tokens still need 32 blocks
        (256, 16, 512, 4, 4),  # never above max_num_seqs
        (10, 16, 512, 256, 1),  # at least one
    ],
)
def test_limit_from_the_kv_budget(
    blocks: int, block_size: int, max_len: int, max_seqs: int, expected: int
) -> None:
    assert derive_concurrency_limit(blocks, block_size, max_len, max_seqs) == expected


def test_footprint_follows_what_requests_ask_then_what_they_use() -> None:
    fp = KvFootprint(max_model_len=4096)
    assert fp.expected_tokens == 4096  # nothing seen yet: the contiguous worst case
    fp.asked(1020 + 256)  # an Azure-conv-like request: prompt + max_tokens
    assert fp.expected_tokens == 1276
    fp.used(1020 + 129)  # it finished after 129 tokens
    assert fp.expected_tokens == 1149
    for _ in range(200):
        fp.asked(4096)  # clients that never set max_tokens do not move the measured mean
        fp.used(1100)
    assert 1100 <= fp.expected_tokens < 1149
    # a pool of 2,048 blocks of 16 holds 29 such requests instead of 8 at max_model_len
    assert derive_concurrency_limit(2048, 16, fp.expected_tokens, 256) == 29
    assert derive_concurrency_limit(2048, 16, 4096, 256) == 8


def test_parse_traffic_classes_accepts_the_operators_json() -> None:
    classes = parse_traffic_classes(
        '[{"name":"interactive","priority":10,"maxQueueWaitSeconds":2.5},'
        ' {"name":"batch","max_queue":5,"maxConcurrency":3,"maxQueueWait":"250ms"}]'
    )
    assert classes == (
        TrafficClass("interactive", priority=10, max_queue_wait_s=2.5),
        TrafficClass("batch", max_queue=5, max_concurrency=3, max_queue_wait_s=0.25),
    )
    assert parse_traffic_classes(None) == (TrafficClass(),)
    assert parse_traffic_classes('{"name": "solo"}') == (TrafficClass("solo"),)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        "[1, 2]",
        '[{"name": "a", "colour": "red"}]',
        '[{"name": "a", "priority": "high"}]',
        '[{"name": "a", "maxQueue": -1}]',
        '[{"name": "a", "maxConcurrency": 0}]',
        '[{"name": "has space"}]',
        '[{"name": "a", "maxQueueWaitSeconds": "soon"}]',
    ],
)
def test_parse_traffic_classes_rejects_bad_input(text: str) -> None:
    with pytest.raises(AdmissionConfigError):
        parse_traffic_classes(text)


def test_duplicate_class_names_are_refused() -> None:
    with pytest.raises(AdmissionConfigError):
        AdmissionController((BATCH, BATCH), 1)


@pytest.mark.parametrize(
    ("value", "seconds"), [(2, 2.0), (0.5, 0.5), ("250ms", 0.25), ("3s", 3.0), ("1m", 60.0)]
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration_s(value) == seconds


def test_observed_waits_and_time_outs_teach_the_predictor() -> None:
    ac = controller(1, warm=False)
    ac.offer(0, BATCH, 0.0)
    ac.release(0, 1.0)  # service time 1 s: one position costs 1 s
    ac.offer(1, BATCH, 1.0)
    ac.offer(2, BATCH, 1.0)  # queued at position 1
    assert ac.predicted_wait_s(BATCH) == pytest.approx(2.0)
    assert ac.cancel(2, timed_out_at=5.0)  # it waited 4 s at position 1 and gave up
    assert ac.predicted_wait_s(BATCH) == pytest.approx(4.0)  # now it expects 4 s a position
