"""`metav1.Condition` bookkeeping: a list-map keyed by type, transitions timed only on a flip."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

JSON = dict[str, Any]
Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class Cond:
    """What a controller concludes; `merge` turns it into a stored condition."""

    type: str
    status: Status
    reason: str
    message: str


def merge(old: Iterable[JSON], new: Iterable[Cond], generation: int, now: str) -> list[JSON]:
    """The new conditions list; `lastTransitionTime` moves only when a condition's status flips.

    Conditions of other types (set by other controllers) are kept as they are.
    """
    previous = {c["type"]: c for c in old}
    merged = dict(previous)
    for cond in new:
        before = previous.get(cond.type)
        flipped = before is None or before.get("status") != cond.status
        merged[cond.type] = {
            "type": cond.type,
            "status": cond.status,
            "observedGeneration": generation,
            "lastTransitionTime": now
            if flipped or before is None
            else before["lastTransitionTime"],
            "reason": cond.reason,
            "message": cond.message,
        }
    return sorted(merged.values(), key=lambda c: str(c["type"]))


def find(conditions: Iterable[JSON], type_: str) -> JSON | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Iterable[JSON], type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"
