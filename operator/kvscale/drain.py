"""The scale-in state machine: weight 0 -> drain -> wait -> mark -> scale down. Pure.

The capacity law names a victim; the replica then walks these steps, one routing tick at a time:

1. `WeightZero`: the routing loop gives it weight 0, so routers stop picking it; after one
   routing interval (when every router has read the new weights) the operator asks the replica
   to drain (`POST /drain` on its admin port: readiness false, nothing new admitted).
2. `Draining`: the operator polls its in-flight requests until they reach 0, or until the drain
   deadline passes.
3. Done: the victim is marked with the lowest pod-deletion-cost and the replicas go down by one,
   so exactly that pod goes and no request fails.

A decision that needs the victim again (as many replicas as it started from) cancels the drain
(`POST /undrain`). `transition` is the whole machine: a state and an event in, the next state and
the actions for the caller to carry out; the capacity loop performs the I/O and feeds the results
back as events.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
LOWEST_DELETION_COST = "-1000"


class Phase(Enum):
    WEIGHT_ZERO = "WeightZero"  # routers are learning that its weight is 0
    DRAINING = "Draining"  # POST /drain sent (or the replica could not take it)


@dataclass(frozen=True)
class Drain:
    """A victim being drained, and the scale-in it is for (from `current` to `target`)."""

    pod: str
    ip: str  # empty once the replica stopped answering: nothing it holds can still finish
    since: float
    current: int
    target: int
    why: str
    phase: Phase = Phase.WEIGHT_ZERO


# -- events: what happened


@dataclass(frozen=True)
class Decided:
    """The capacity law's decision (`victim` and its address when it wants one replica fewer)."""

    now: float
    desired: int
    current: int
    message: str
    victim: str | None = None
    ip: str | None = None
    drainable: bool = True  # a kvscale engine (it has the admin API) and no pinned count
    pinned: bool = False


@dataclass(frozen=True)
class Ticked:
    """A routing tick passed."""

    now: float
    routing_interval_s: float


@dataclass(frozen=True)
class Answered:
    """The victim's answer to an `AdminCall`: its unfinished requests, None if it did not answer."""

    now: float
    in_flight: int | None


Event = Decided | Ticked | Answered


# -- actions: what the caller does


@dataclass(frozen=True)
class Announce:
    """Tell the user (an Event) that the victim is being drained."""


@dataclass(frozen=True)
class AdminCall:
    """`POST /drain` (stop taking work) or `GET /drain` (how much is in flight) on the victim."""

    method: Literal["POST", "GET"]
    ip: str


@dataclass(frozen=True)
class Undrain:
    """Cancel the drain on the replica (`ip` empty: it does not answer, nothing to send)."""

    drain: Drain
    desired: int
    message: str


@dataclass(frozen=True)
class MarkDeletionCost:
    pod: str


@dataclass(frozen=True)
class ScaleTo:
    replicas: int
    why: str


Action = Announce | AdminCall | Undrain | MarkDeletionCost | ScaleTo


@dataclass(frozen=True)
class Step:
    drain: Drain | None
    actions: list[Action] = field(default_factory=list)


def transition(drain: Drain | None, event: Event, timeout_s: float) -> Step:
    """The next state of a scale-in and what to do about it; `timeout_s` bounds the wait."""
    match event:
        case Decided():
            return _decided(drain, event)
        case Ticked() if drain is not None:
            if drain.phase is Phase.WEIGHT_ZERO:
                if event.now - drain.since < event.routing_interval_s:
                    return Step(drain)  # routers first learn that its weight is 0
                return Step(drain, [AdminCall("POST", drain.ip)])
            if drain.ip:
                return Step(drain, [AdminCall("GET", drain.ip)])
            return transition(drain, Answered(event.now, None), timeout_s)
        case Answered() if drain is not None and drain.phase is Phase.WEIGHT_ZERO:
            ip = drain.ip if event.in_flight is not None else ""  # silent: it cannot take work
            return Step(replace(drain, ip=ip, phase=Phase.DRAINING))
        case Answered() if drain is not None:
            busy = event.in_flight or 0  # silent: gone or dead, nothing it holds can finish
            if busy > 0 and event.now - drain.since < timeout_s:
                return Step(drain)
            waited = event.now - drain.since
            why = f"{drain.pod} drained in {waited:.0f} s ({drain.why})"
            return Step(None, [MarkDeletionCost(drain.pod), ScaleTo(drain.target, why)])
    return Step(drain)


def _decided(drain: Drain | None, event: Decided) -> Step:
    actions: list[Action] = []
    if drain is not None and event.desired >= drain.current:  # demand came back
        actions.append(Undrain(drain, event.desired, event.message))
        drain = None
    if event.pinned or drain is not None:
        return Step(drain, actions)
    if event.desired < event.current and event.drainable and event.victim:
        if event.ip is None:
            return Step(None, actions)  # no address to drain yet: the next decision retries
        started = Drain(
            event.victim, event.ip, event.now, event.current, event.desired, event.message
        )
        return Step(started, [*actions, Announce()])
    if event.desired != event.current:
        actions.append(ScaleTo(event.desired, event.message))
    return Step(None, actions)
