"""Admission control: decide, per traffic class, whether a request runs now, waits, or is refused.

Continuous batching admits everything, so a burst above capacity lands in the engine's queue and
every request's time to first token grows with it. Refusing early and fast (HTTP 429 with
Retry-After) keeps the p99 of the requests that are admitted inside the SLO and lets a router or
client go elsewhere. The replica-wide concurrency limit is the number of requests whose KV cache
fits in the budget at the expected length of a request (measured, not `max_model_len`: the
engine's preemption absorbs the long tail); each class has its own limit, queue bound and maximum
queue wait. A request is queued only when its first token is predicted within that wait: the
queue's predicted wait plus the measured time from a slot to a first token (a class's maximum
wait is usually its TTFT SLO, and the prefill after the queue counts against it too).

Pure logic: time is passed in, nothing here blocks or sleeps. Higher `priority` is served first,
as in the LLMEndpoint spec and the engine's scheduler. A deferrable class (`deadlineSeconds`) ranks
below every interactive class whatever its own priority (`engine_priorities`), and its requests
do not count against the replica-wide limit an interactive request is admitted under: the engine
preempts deferred work to make room for it.

The --traffic-classes format is defined once, in engine-image/traffic-classes.schema.json; the
router parses the same flag with its own code (the packages may not import each other), and
tests/unit/test_traffic_class_schema.py holds both parsers to that file.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Reason = Literal["queue_full", "deadline", "timeout", "draining"]
DEFAULT_CLASS_NAME = "default"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*$")


class AdmissionConfigError(ValueError):
    """A traffic-class setting is invalid."""


@dataclass(frozen=True)
class TrafficClass:
    name: str = DEFAULT_CLASS_NAME
    priority: int = 0
    max_concurrency: int | None = None  # None: only the replica-wide limit applies
    max_queue: int = 256
    max_queue_wait_s: float = 10.0
    deadline_s: float | None = None  # set: deferrable, ranked below every interactive class

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,63}", self.name):
            raise AdmissionConfigError(f"traffic class name {self.name!r} is not a simple name")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise AdmissionConfigError(f"{self.name}: maxConcurrency must be >= 1")
        if self.max_queue < 0:
            raise AdmissionConfigError(f"{self.name}: maxQueue must be >= 0")
        if not self.max_queue_wait_s >= 0:
            raise AdmissionConfigError(f"{self.name}: maxQueueWait must be >= 0")
        if self.deadline_s is not None and not 0 < self.deadline_s < math.inf:
            raise AdmissionConfigError(f"{self.name}: deadlineSeconds must be a number > 0")

    @property
    def deferrable(self) -> bool:
        return self.deadline_s is not None


@dataclass(frozen=True)
class Verdict:
    outcome: Literal["admit", "queue", "reject"]
    reason: Reason | None = None
    retry_after_s: float = 0.0


@dataclass
class _Waiter:
    ticket: int
    traffic_class: TrafficClass
    arrival: float
    position: int  # 1 + the requests ahead of it when it arrived


@dataclass
class _Running:
    traffic_class: TrafficClass
    admitted_at: float


@dataclass
class _Ewma:
    """Exponentially weighted mean."""

    alpha: float = 0.1
    mean_s: float | None = None

    def observe(self, seconds: float) -> None:
        if self.mean_s is None:
            self.mean_s = seconds
        else:
            self.mean_s += self.alpha * (seconds - self.mean_s)


@dataclass
class AdmissionController:
    classes: tuple[TrafficClass, ...]
    limit: int | None  # replica-wide concurrency; None: unlimited
    default_class: str = DEFAULT_CLASS_NAME
    # queue only what is predicted to have its first token within this share of the class's
    # maximum wait (the queue's predicted wait plus the measured time from a slot to a first
    # token: the client waits for both): predictions are noisy, and a request that times out in
    # the queue is refused late instead of fast
    headroom: float = 0.8
    draining: bool = False
    _by_name: dict[str, TrafficClass] = field(init=False)
    _queues: dict[str, deque[_Waiter]] = field(init=False)
    _running: dict[int, _Running] = field(init=False, default_factory=dict)
    _per_class: dict[str, int] = field(init=False)
    # how long an admitted request holds its slot
    _service: _Ewma = field(init=False, default_factory=_Ewma)
    # observed queue wait per position in the queue (what the predictor above actually delivered)
    _per_position: _Ewma = field(init=False, default_factory=lambda: _Ewma(alpha=0.2))
    # from a slot to the first token: the part of a request's wait that comes after the queue
    _first_token: _Ewma = field(init=False, default_factory=_Ewma)

    def __post_init__(self) -> None:
        if not self.classes:
            self.classes = (TrafficClass(self.default_class),)
        self._by_name = {c.name: c for c in self.classes}
        if len(self._by_name) != len(self.classes):
            raise AdmissionConfigError("traffic class names must be unique")
        if self.default_class not in self._by_name:
            self.default_class = self.classes[0].name
        if not 0.0 < self.headroom <= 1.0:
            raise AdmissionConfigError(f"headroom must be in (0, 1], got {self.headroom}")
        if self.limit is not None and self.limit < 1:
            raise AdmissionConfigError(f"concurrency limit must be >= 1, got {self.limit}")
        self._queues = {c.name: deque() for c in self.classes}
        self._per_class = {c.name: 0 for c in self.classes}
        self._rank = engine_priorities(self.classes)

    def priority_of(self, traffic_class: TrafficClass) -> int:
        """The priority the engine runs the class's requests at."""
        return self._rank[traffic_class.name]

    def resolve(self, name: str | None) -> TrafficClass:
        """The class a request names, or the default for a missing or unknown name."""
        return self._by_name.get(name or "", self._by_name[self.default_class])

    def offer(self, ticket: int, traffic_class: TrafficClass, now: float) -> Verdict:
        if self.draining:
            return Verdict("reject", "draining", 1.0)
        if self._can_start(traffic_class) and not self._queues[traffic_class.name]:
            self._start(ticket, traffic_class, now)
            return Verdict("admit")
        queue = self._queues[traffic_class.name]
        predicted = self.predicted_wait_s(traffic_class)
        retry = max(1.0, math.ceil(predicted))
        if len(queue) >= self._queue_bound(traffic_class):
            return Verdict("reject", "queue_full", retry)
        if predicted + self.first_token_s > self.headroom * traffic_class.max_queue_wait_s:
            return Verdict("reject", "deadline", retry)
        queue.append(_Waiter(ticket, traffic_class, now, self._ahead(traffic_class) + 1))
        return Verdict("queue")

    def set_limit(self, limit: int | None, now: float) -> list[int]:
        """Change the replica-wide limit; returns the queued tickets a higher limit starts."""
        if limit is not None and limit < 1:
            raise AdmissionConfigError(f"concurrency limit must be >= 1, got {limit}")
        self.limit = limit
        return self.dispatch(now)

    def release(self, ticket: int, now: float, first_token_at: float | None = None) -> list[int]:
        """An admitted request finished (its first token at `first_token_at`, if it had one);
        returns the queued tickets that may start now."""
        running = self._running.pop(ticket)
        self._per_class[running.traffic_class.name] -= 1
        self._service.observe(now - running.admitted_at)
        if first_token_at is not None:
            self._first_token.observe(max(0.0, first_token_at - running.admitted_at))
        return self.dispatch(now)

    def cancel(self, ticket: int, timed_out_at: float | None = None) -> bool:
        """Remove a ticket still in a queue; False if not queued.

        A time-out (timed_out_at given) teaches the predictor that waits run longer than it said.
        """
        for queue in self._queues.values():
            for waiter in queue:
                if waiter.ticket == ticket:
                    queue.remove(waiter)
                    if timed_out_at is not None:
                        elapsed = timed_out_at - waiter.arrival
                        self._per_position.observe(elapsed / waiter.position)
                    return True
        return False

    def dispatch(self, now: float) -> list[int]:
        """Start queued tickets while there are free slots, most important class first."""
        started: list[int] = []
        for cls in sorted(self.classes, key=lambda c: -self._rank[c.name]):
            queue = self._queues[cls.name]
            while queue and self._can_start(cls):
                waiter = queue.popleft()
                self._per_position.observe((now - waiter.arrival) / waiter.position)
                self._start(waiter.ticket, cls, now)
                started.append(waiter.ticket)
        return started

    def predicted_wait_s(self, traffic_class: TrafficClass) -> float:
        """Expected queue wait of a request of this class that arrives now.

        Requests ahead of it are the queued ones of equal or more important classes. Each position
        costs the larger of: mean service time / slots (slots free at that rate), and the wait
        per position that queued requests actually saw. Unknown (0) before any request completed.
        """
        mean = self._service.mean_s
        if mean is None:
            return 0.0
        per_position = max(mean / self._slots(traffic_class), self._per_position.mean_s or 0.0)
        return (self._ahead(traffic_class) + 1) * per_position

    @property
    def first_token_s(self) -> float:
        """Mean time from a slot to the first token (0 before any request had one)."""
        return self._first_token.mean_s or 0.0

    def _ahead(self, traffic_class: TrafficClass) -> int:
        rank = self._rank[traffic_class.name]
        return sum(len(self._queues[c.name]) for c in self.classes if self._rank[c.name] >= rank)

    def start_draining(self) -> None:
        self.draining = True

    def stop_draining(self) -> None:
        self.draining = False

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def load(self) -> dict[str, tuple[int, int]]:
        """Per class: (queued, in flight)."""
        return {c.name: (len(self._queues[c.name]), self._per_class[c.name]) for c in self.classes}

    def _queue_bound(self, cls: TrafficClass) -> int:
        """The class's bound; for a cold replica, one more wave of the class's slots at most.

        A cold replica (one just added for a burst) cannot predict waits yet. Refusing everything
        beyond its limit would turn the burst it was added for away; queueing blind could let
        waits run long. One wave is the conservative middle: those requests start as soon as the
        running ones finish, and the class's deadline still bounds their wait.
        """
        if self._service.mean_s is not None:
            return cls.max_queue
        return min(cls.max_queue, self._slots(cls))

    def _slots(self, cls: TrafficClass) -> int:
        limits = [x for x in (self.limit, cls.max_concurrency) if x is not None]
        return max(1, min(limits)) if limits else max(1, self.in_flight)

    def _can_start(self, cls: TrafficClass) -> bool:
        if self.limit is not None and self._counted(cls) >= self.limit:
            return False
        return cls.max_concurrency is None or self._per_class[cls.name] < cls.max_concurrency

    def _counted(self, cls: TrafficClass) -> int:
        """Requests in flight that hold a place `cls` would need (deferred work yields its own
        to interactive requests)."""
        if cls.deferrable:
            return self.in_flight
        return sum(n for c, n in self._per_class.items() if not self._by_name[c].deferrable)

    def _start(self, ticket: int, cls: TrafficClass, now: float) -> None:
        self._running[ticket] = _Running(cls, now)
        self._per_class[cls.name] += 1


def engine_priorities(classes: Iterable[TrafficClass]) -> dict[str, int]:
    """Per class, the priority its requests run at: an interactive class's own; deferrable classes
    below the least important interactive one, in their own order."""
    classes = tuple(classes)
    interactive = [c.priority for c in classes if not c.deferrable]
    deferrable = [c.priority for c in classes if c.deferrable]
    floor, top = min(interactive, default=0) - 1, max(deferrable, default=0)
    return {c.name: floor - (top - c.priority) if c.deferrable else c.priority for c in classes}


def derive_concurrency_limit(
    num_kv_blocks: int, block_size: int, tokens_per_request: float, max_num_seqs: int
) -> int:
    """How many requests fit in the KV budget when each holds `tokens_per_request` tokens."""
    blocks_per_request = max(1, math.ceil(tokens_per_request / block_size))
    return max(1, min(max_num_seqs, num_kv_blocks // blocks_per_request))


@dataclass
class KvFootprint:
    """The expected KV tokens of one request, from what requests asked for and then what they used.

    Until a request finishes, the mean of prompt + max_tokens of the requests seen (what they may
    grow to); afterwards, the mean of prompt + generated tokens of finished ones (what they did
    grow to). Before any request, `max_model_len`. A request's footprint grows from its prompt to
    its final length, so its final length overstates what it holds on average: the estimate errs
    on the safe side, and preemption covers requests longer than the mean.
    """

    max_model_len: int
    alpha: float = 0.05
    _asked: _Ewma = field(init=False)
    _used: _Ewma = field(init=False)

    def __post_init__(self) -> None:
        self._asked = _Ewma(self.alpha)
        self._used = _Ewma(self.alpha)

    def asked(self, tokens: int) -> None:
        self._asked.observe(float(min(tokens, self.max_model_len)))

    def used(self, tokens: int) -> None:
        self._used.observe(float(min(tokens, self.max_model_len)))

    @property
    def expected_tokens(self) -> float:
        for mean in (self._used.mean_s, self._asked.mean_s):
            if mean is not None:
                return mean
        return float(self.max_model_len)


def parse_duration_s(value: Any) -> float:
    """Seconds from a number or a string such as '250ms', '2s', '1m', '1.5'."""
    if isinstance(value, bool):
        raise AdmissionConfigError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise AdmissionConfigError(f"not a duration: {value!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[match.group(2)]
    return float(match.group(1)) * scale


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


def traffic_class_from_mapping(raw: Mapping[str, Any]) -> TrafficClass:
    """One class from JSON; keys in camelCase (as in the LLMEndpoint spec) or snake_case."""
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        target = _KEYS.get(key.replace("_", "").lower())
        if target is None:
            raise AdmissionConfigError(f"unknown traffic class field {key!r}")
        if target == "max_queue_wait_s":
            value = parse_duration_s(value)
        elif target in ("max_concurrency", "deadline_s") and value is None:
            pass  # only the replica-wide limit applies; an interactive class
        elif target == "deadline_s" and value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise AdmissionConfigError(f"{key} must be a number of seconds, got {value!r}")
            value = float(value)
        elif target != "name" and not _is_int(value):
            raise AdmissionConfigError(f"{key} must be an integer, got {value!r}")
        fields[target] = value
    return TrafficClass(**fields)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_traffic_classes(text: str | None) -> tuple[TrafficClass, ...]:
    """Classes from the --traffic-classes JSON: a list of objects (or one object)."""
    if not text:
        return (TrafficClass(),)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdmissionConfigError(f"--traffic-classes is not JSON: {exc}") from exc
    items: Iterable[Any] = [raw] if isinstance(raw, dict) else raw
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items) or not items:
        raise AdmissionConfigError("--traffic-classes must be a JSON list of objects")
    classes = tuple(traffic_class_from_mapping(i) for i in items)
    if len({c.name for c in classes}) != len(classes):
        raise AdmissionConfigError("traffic class names must be unique")
    return classes
