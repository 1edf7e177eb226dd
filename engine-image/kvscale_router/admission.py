"""Router-level admission per traffic class: run now, wait in the class's queue, or refuse.

The classes come from `--traffic-classes` (the JSON the engine takes, rendered from the
endpoint's `trafficClasses`): `name`, `priority` (higher is served first), `maxConcurrency`
(requests of the class in flight through this router; none: unlimited), `maxQueue` (waiting
requests; a full queue refuses at once) and `maxQueueWaitSeconds` (a request still queued then is
refused). Refusals are 429 + Retry-After, so clients back off instead of piling onto replicas.
A class with `deadlineSeconds` is deferrable: its requests wait in the deferred queue
(deferred.py) instead, until spare capacity or their deadline releases them.
The class comes from the `x-kvscale-class` header; the first class is the default.

The format is defined once, in engine-image/traffic-classes.schema.json; the engine parses the
same flag with its own code (the packages may not import each other), and
tests/unit/test_traffic_class_schema.py holds both parsers to that file.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CLASS_HEADER = "x-kvscale-class"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*$")
_KEYS = {
    "name": "name",
    "priority": "priority",
    "maxconcurrency": "max_concurrency",
    "maxqueue": "max_queue",
    "maxqueuelength": "max_queue",
    "maxqueuewait": "max_queue_wait_s",
    "maxqueuewaits": "max_queue_wait_s",
    "maxqueuewaitseconds": "max_queue_wait_s",
    "deadlineseconds": "deadline_s",
}


class ClassConfigError(ValueError):
    """--traffic-classes is not valid."""


class Refused(Exception):
    """A request the router will not forward: the HTTP status, a reason code and Retry-After."""

    def __init__(
        self, status: int, reason: str, retry_after_s: int, traffic_class: str, message: str
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.traffic_class = traffic_class


@dataclass(frozen=True)
class TrafficClass:
    name: str = "default"
    priority: int = 0
    max_concurrency: int | None = None
    max_queue: int = 256
    max_queue_wait_s: float = 10.0
    deadline_s: float | None = None  # set: deferrable, complete within this long of arrival

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,63}", self.name):
            raise ClassConfigError(f"traffic class name {self.name!r} is not a simple name")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ClassConfigError(f"{self.name}: maxConcurrency must be >= 1")
        if self.max_queue < 0 or not self.max_queue_wait_s >= 0:
            raise ClassConfigError(f"{self.name}: maxQueue and maxQueueWait must be >= 0")
        if self.deadline_s is not None and not 0 < self.deadline_s < math.inf:
            raise ClassConfigError(f"{self.name}: deadlineSeconds must be a number > 0")

    @property
    def deferrable(self) -> bool:
        return self.deadline_s is not None

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.max_queue_wait_s))


def _duration_s(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ClassConfigError(f"not a duration: {value!r}")
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[match.group(2)]


def _deadline_s(key: str, value: Any) -> float | None:
    if value is None:
        return None  # interactive
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ClassConfigError(f"{key} must be a number of seconds, got {value!r}")
    return float(value)


def _traffic_class(raw: Mapping[str, Any]) -> TrafficClass:
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        target = _KEYS.get(key.replace("_", "").lower())
        if target is None:
            raise ClassConfigError(f"unknown traffic class field {key!r}")
        if target == "max_queue_wait_s":
            value = _duration_s(value)
        elif target == "max_concurrency" and value is None:
            pass  # unlimited
        elif target == "deadline_s":
            value = _deadline_s(key, value)
        elif target != "name" and type(value) is not int:
            raise ClassConfigError(f"{key} must be an integer, got {value!r}")
        fields[target] = value
    return TrafficClass(**fields)


def parse_traffic_classes(text: str | None) -> tuple[TrafficClass, ...]:
    if not text:
        return (TrafficClass(),)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClassConfigError(f"--traffic-classes is not JSON: {exc}") from exc
    items = [raw] if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise ClassConfigError("--traffic-classes must be a JSON list of objects")
    classes = tuple(_traffic_class(i) for i in items)
    if len({c.name for c in classes}) != len(classes):
        raise ClassConfigError("traffic class names must be unique")
    return classes


class Admission:
    """Slots and queues per class; a freed slot goes to the most important waiting class."""

    def __init__(self, classes: tuple[TrafficClass, ...]) -> None:
        self.classes = classes or (TrafficClass(),)
        self._by_name = {c.name: c for c in self.classes}
        self.running = {c.name: 0 for c in self.classes}
        self.queues: dict[str, deque[asyncio.Future[None]]] = {
            c.name: deque() for c in self.classes
        }

    def resolve(self, name: str | None) -> TrafficClass:
        """The named class, or the default (the first) for a missing or unknown name."""
        return self._by_name.get(name or "", self.classes[0])

    async def enter(self, cls: TrafficClass) -> None:
        """Return once the request may run; raises Refused (429) past the queue bounds."""
        queue = self.queues[cls.name]
        if not queue and self._has_slot(cls):
            self.running[cls.name] += 1
            return
        if len(queue) >= cls.max_queue:
            message = f"Traffic class {cls.name!r} has {len(queue)} requests queued."
            raise Refused(429, "queue_full", cls.retry_after_s, cls.name, message)
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(slot)
        try:
            await asyncio.wait_for(asyncio.shield(slot), cls.max_queue_wait_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if slot.done():  # the slot arrived as the wait ended: hand it on
                self.leave(cls)
            else:
                slot.cancel()
                queue.remove(slot)
            if isinstance(exc, asyncio.CancelledError):
                raise
            message = f"Queued longer than {cls.max_queue_wait_s:g} s in class {cls.name!r}."
            raise Refused(429, "deadline", cls.retry_after_s, cls.name, message) from None

    def leave(self, cls: TrafficClass) -> None:
        self.running[cls.name] -= 1
        for c in sorted(self.classes, key=lambda c: -c.priority):
            queue = self.queues[c.name]
            while queue and self._has_slot(c):
                slot = queue.popleft()
                self.running[c.name] += 1
                slot.set_result(None)

    def depth(self, cls: TrafficClass) -> int:
        return len(self.queues[cls.name])

    def free_slots(self, cls: TrafficClass) -> int | None:
        """Requests of the class that may still start (None: unlimited)."""
        if cls.max_concurrency is None:
            return None
        return max(0, cls.max_concurrency - self.running[cls.name] - len(self.queues[cls.name]))

    def _has_slot(self, cls: TrafficClass) -> bool:
        return cls.max_concurrency is None or self.running[cls.name] < cls.max_concurrency
