"""What the API server says of an endpoint's pods, in the terms the loops use. Pure functions.

Ready pods with an address are what a signal source reads; the counts (ready, starting, not
placed) and the measured start-up time (pod created -> Ready) go into the snapshot's `Fleet`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from kvscale.signals.snapshot import Fleet
from kvscale.signals.source import PodAddress
from kvscale.timestamps import parse

JSON = dict[str, Any]


def _condition(pod: JSON, type_: str) -> JSON:
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def live(pods: Iterable[JSON]) -> list[JSON]:
    """Pods that are not being deleted."""
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: JSON) -> bool:
    return _condition(pod, "Ready").get("status") == "True"


def unschedulable(pod: JSON) -> bool:
    """The scheduler found no node for it: `PodScheduled` is False with reason Unschedulable.

    The status matters: a scheduled pod's condition is True, whatever reason it still carries.
    """
    cond = _condition(pod, "PodScheduled")
    return cond.get("status") == "False" and cond.get("reason") == "Unschedulable"


def scheduling_message(pod: JSON) -> str:
    """What the scheduler said of the pod (why it found no node), or an empty string."""
    return str(_condition(pod, "PodScheduled").get("message", ""))


def created_at(pod: JSON) -> float | None:
    return parse(pod["metadata"].get("creationTimestamp"))


def ready_since(pod: JSON) -> float | None:
    """When the pod last turned Ready (None when it is not)."""
    ready = _condition(pod, "Ready")
    return parse(ready.get("lastTransitionTime")) if ready.get("status") == "True" else None


def startup_seconds(pods: Iterable[JSON]) -> float | None:
    """Median time from creation to Ready of the ready pods (None before any is ready)."""
    spans = []
    for pod in pods:
        ready = _condition(pod, "Ready")
        start, end = created_at(pod), parse(ready.get("lastTransitionTime"))
        if ready.get("status") == "True" and start is not None and end is not None:
            spans.append(max(end - start, 0.0))
    return statistics.median(spans) if spans else None


def addresses(pods: Iterable[JSON], port: int) -> tuple[PodAddress, ...]:
    """Ready, live pods that have an IP, sorted by name."""
    found = [
        PodAddress(p["metadata"]["name"], p["status"]["podIP"], port)
        for p in live(pods)
        if is_ready(p) and p.get("status", {}).get("podIP")
    ]
    return tuple(sorted(found, key=lambda a: a.name))


def fleet(current: int, pods: Iterable[JSON]) -> Fleet:
    alive = live(pods)
    ready = sum(1 for p in alive if is_ready(p))
    pending = [p for p in alive if unschedulable(p)]
    reasons = sorted({scheduling_message(p) for p in pending} - {""})
    return Fleet(
        current=current,
        ready=ready,
        starting=max(len(alive) - ready - len(pending), 0),
        unschedulable=len(pending),
        unschedulable_reason="; ".join(reasons),
        startup_seconds=startup_seconds(alive),
    )
