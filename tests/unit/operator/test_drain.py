"""The scale-in state machine, one transition at a time, then a whole scale-in."""

from __future__ import annotations

from kvscale import drain
from kvscale.drain import (
    AdminCall,
    Announce,
    Answered,
    Decided,
    Drain,
    MarkDeletionCost,
    Phase,
    ScaleTo,
    Step,
    Ticked,
    Undrain,
)

TIMEOUT = 30.0
VICTIM = Drain("p-2", "10.0.0.3", since=100.0, current=3, target=2, why="demand fell")
DRAINING = Drain("p-2", "10.0.0.3", 100.0, 3, 2, "demand fell", Phase.DRAINING)


def step(state: Drain | None, event: drain.Event) -> Step:
    return drain.transition(state, event, TIMEOUT)


def scale_in(**over: object) -> Decided:
    fields: dict[str, object] = {
        "now": 100.0,
        "desired": 2,
        "current": 3,
        "message": "demand fell",
        "victim": "p-2",
        "ip": "10.0.0.3",
    }
    return Decided(**{**fields, **over})  # type: ignore[arg-type]


def test_a_scale_in_with_a_victim_starts_at_weight_zero() -> None:
    assert step(None, scale_in()) == Step(VICTIM, [Announce()])


def test_a_victim_without_an_address_waits_for_the_next_decision() -> None:
    assert step(None, scale_in(ip=None)) == Step(None, [])


def test_engines_without_the_admin_api_and_decisions_without_a_victim_scale_at_once() -> None:
    at_once = Step(None, [ScaleTo(2, "demand fell")])
    assert step(None, scale_in(drainable=False)) == at_once
    assert step(None, scale_in(victim=None)) == at_once


def test_a_scale_out_applies_at_once_and_a_steady_decision_does_nothing() -> None:
    assert step(None, scale_in(desired=5)) == Step(None, [ScaleTo(5, "demand fell")])
    assert step(None, scale_in(desired=3)) == Step(None, [])


def test_a_pinned_count_starts_nothing() -> None:
    assert step(None, scale_in(pinned=True)) == Step(None, [])


def test_routers_get_one_routing_interval_to_see_weight_zero() -> None:
    assert step(VICTIM, Ticked(now=104.0, routing_interval_s=5.0)) == Step(VICTIM, [])
    assert step(VICTIM, Ticked(now=105.0, routing_interval_s=5.0)) == Step(
        VICTIM, [AdminCall("POST", "10.0.0.3")]
    )


def test_a_drain_request_moves_to_draining_and_a_failed_one_forgets_the_address() -> None:
    assert step(VICTIM, Answered(105.0, in_flight=0)) == Step(DRAINING)
    failed = step(VICTIM, Answered(105.0, in_flight=None)).drain
    assert failed is not None and failed.phase is Phase.DRAINING and failed.ip == ""


def test_a_draining_victim_is_polled_until_nothing_is_in_flight() -> None:
    assert step(DRAINING, Ticked(110.0, 5.0)) == Step(DRAINING, [AdminCall("GET", "10.0.0.3")])
    assert step(DRAINING, Answered(110.0, in_flight=2)) == Step(DRAINING, [])
    done = step(DRAINING, Answered(112.0, in_flight=0))
    assert done == Step(
        None, [MarkDeletionCost("p-2"), ScaleTo(2, "p-2 drained in 12 s (demand fell)")]
    )


def test_the_drain_deadline_scales_in_with_requests_still_in_flight() -> None:
    assert step(DRAINING, Answered(129.0, in_flight=1)).drain == DRAINING
    done = step(DRAINING, Answered(130.0, in_flight=1))
    assert done.drain is None and done.actions[0] == MarkDeletionCost("p-2")


def test_a_victim_that_stopped_answering_is_scaled_in_without_a_poll() -> None:
    mute = Drain("p-2", "", 100.0, 3, 2, "demand fell", Phase.DRAINING)
    assert step(mute, Ticked(110.0, 5.0)) == Step(
        None, [MarkDeletionCost("p-2"), ScaleTo(2, "p-2 drained in 10 s (demand fell)")]
    )


def test_demand_coming_back_undrains_the_victim() -> None:
    back = scale_in(now=110.0, desired=3, message="demand rose")
    assert step(DRAINING, back) == Step(None, [Undrain(DRAINING, 3, "demand rose")])
    grow = scale_in(now=110.0, desired=4, message="demand rose")
    assert step(VICTIM, grow) == Step(
        None, [Undrain(VICTIM, 4, "demand rose"), ScaleTo(4, "demand rose")]
    )


def test_a_decision_below_the_drains_start_keeps_it_running() -> None:
    assert step(DRAINING, scale_in(now=110.0, desired=1)) == Step(DRAINING, [])


def test_a_pinned_count_at_or_above_the_start_cancels_but_does_not_scale() -> None:
    pinned = scale_in(now=110.0, desired=3, pinned=True)
    assert step(DRAINING, pinned) == Step(None, [Undrain(DRAINING, 3, "demand fell")])


def test_events_without_a_drain_change_nothing() -> None:
    for event in (Ticked(1.0, 5.0), Answered(1.0, 0), Answered(1.0, None)):
        assert step(None, event) == Step(None, [])


def test_a_whole_scale_in_walks_weight_zero_drain_wait_mark_scale_down() -> None:
    state, taken = None, []
    script: list[tuple[drain.Event, type]] = [
        (scale_in(), Announce),
        (Ticked(102.0, 5.0), type(None)),
        (Ticked(105.0, 5.0), AdminCall),
        (Answered(105.0, 0), type(None)),
        (Ticked(110.0, 5.0), AdminCall),
        (Answered(110.0, 1), type(None)),
        (Ticked(115.0, 5.0), AdminCall),
        (Answered(115.0, 0), MarkDeletionCost),
    ]
    for event, first in script:
        result = step(state, event)
        state = result.drain
        assert type(result.actions[0] if result.actions else None) is first, event
        taken += result.actions
    assert state is None and taken[-1] == ScaleTo(2, "p-2 drained in 15 s (demand fell)")


def test_a_poll_without_an_answer_scales_in_at_once() -> None:
    done = step(DRAINING, Answered(111.0, in_flight=None))
    assert done == Step(
        None, [MarkDeletionCost("p-2"), ScaleTo(2, "p-2 drained in 11 s (demand fell)")]
    )
