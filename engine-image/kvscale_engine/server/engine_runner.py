"""What the server needs from an engine that runs beside its event loop: requests in, each step's
outputs out to one asyncio queue per request.

Two runners share this: `EngineThread` (the engine in the server's process, on a thread of its
own: tests, and apps built around an engine object) and `EngineProcess` (the engine in a child
process: `kvscale-engine serve`). The queues live here, on the event loop; a runner hands requests
and aborts to its engine, which applies them before its next step, and hands each step's
`StepResult` back to `deliver`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.outputs import EngineStats, RequestOutput
from kvscale_engine.engine.tokenizer import Tokenizer
from kvscale_engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # the server's process never imports torch: the engine runs in a child
    from kvscale_engine.engine.llm_engine import LLMEngine

Item = RequestOutput | BaseException


@dataclass(frozen=True)
class Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    traffic_class: str
    preemptible: bool


@dataclass(frozen=True)
class StepResult:
    outputs: list[RequestOutput]
    failed: list[tuple[str, BaseException]]  # adds the engine refused (ValueError)
    stats: EngineStats
    busy: bool  # unfinished requests remain: step again without waiting for more


def step_once(engine: LLMEngine, adds: list[Add], aborts: list[str]) -> StepResult:
    """Apply the adds, then the aborts, then run one step if anything is left to run."""
    failed: list[tuple[str, BaseException]] = []
    for a in adds:
        try:
            engine.add_request(
                a.request_id, a.prompt_token_ids, a.params, a.priority, a.arrival_time,
                a.traffic_class, a.preemptible,
            )  # fmt: skip
        except ValueError as exc:
            failed.append((a.request_id, exc))
    for request_id in aborts:
        engine.abort_request(request_id)  # a no-op for one that finished meanwhile
    outputs = engine.step() if engine.has_unfinished_requests() else []
    return StepResult(outputs, failed, engine.stats(), engine.has_unfinished_requests())


class EngineRunner(ABC):
    """The per-request queues, on the event loop; subclasses move requests to the engine."""

    config: EngineConfig
    tokenizer: Tokenizer
    vocab_size: int

    def __init__(self, on_stats: Callable[[EngineStats], None]) -> None:
        self.error: BaseException | None = None  # once set, the engine is gone for good
        self._on_stats = on_stats
        self._streams: dict[str, asyncio.Queue[Item]] = {}

    @abstractmethod
    async def start(self) -> EngineStats:
        """Start the engine; its first stats once it can take requests."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop the engine once its step in progress ends."""

    @abstractmethod
    async def stats(self) -> EngineStats:
        """The engine's stats now, between two steps."""

    @abstractmethod
    def _submit(self, add: Add) -> None:
        """Hand a request to the engine, for its next step."""

    @abstractmethod
    def _cancel(self, request_id: str) -> None:
        """Abort a request the engine may already hold."""

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int,
        arrival_time: float,
        stream: asyncio.Queue[Item] | None = None,
        traffic_class: str = "",
        preemptible: bool = False,
    ) -> asyncio.Queue[Item]:
        """Queue a request for the next step; its outputs go to `stream` (a new queue if None)."""
        if self.error is not None:
            raise RuntimeError("the engine failed earlier") from self.error
        stream = asyncio.Queue() if stream is None else stream
        self._streams[request_id] = stream
        self._submit(
            Add(request_id, prompt_token_ids, params, priority, arrival_time, traffic_class,
                preemptible)
        )  # fmt: skip
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request; the engine frees its KV blocks before its next step."""
        if self._streams.pop(request_id, None) is None:
            return  # finished already
        self._cancel(request_id)

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def deliver(self, result: StepResult) -> None:
        """Put a step's outputs on their requests' queues (on the event loop, in step order)."""
        for request_id, exc in result.failed:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put_nowait(exc)
        for out in result.outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted while the step ran
            stream.put_nowait(out)
            if out.finished:
                del self._streams[out.request_id]
        self._on_stats(result.stats)

    def fail_all(self, exc: BaseException) -> None:
        """The engine is gone: every request in flight gets `exc`, and no new one is taken."""
        self.error = exc
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(exc)
