"""The engine's own thread: the server hands every engine call to it and awaits the result.

Every engine call (add, abort, step, stats) runs on one worker thread, so the engine needs no
locks and the event loop stays free to accept connections and stream tokens while a step runs.
Requests and aborts that arrive during a step are applied before the next one; each request's
outputs go to its own asyncio queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.outputs import EngineStats, RequestOutput
from kvscale_engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")
Item = RequestOutput | BaseException


@dataclass(frozen=True)
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    traffic_class: str
    preemptible: bool


@dataclass(frozen=True)
class _StepResult:
    outputs: list[RequestOutput]
    failed: list[tuple[str, BaseException]]
    stats: EngineStats
    busy: bool


class EngineThread:
    def __init__(self, engine: LLMEngine, on_stats: Callable[[EngineStats], None]) -> None:
        self.engine = engine
        self.error: BaseException | None = None
        self._on_stats = on_stats
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._streams: dict[str, asyncio.Queue[Item]] = {}
        self._adds: list[_Add] = []
        self._aborts: list[str] = []
        self._busy = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="engine-steps")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread, between steps."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

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
        self._adds.append(
            _Add(request_id, prompt_token_ids, params, priority, arrival_time, traffic_class,
                 preemptible)
        )  # fmt: skip
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request; the engine frees its KV blocks before its next step."""
        if self._streams.pop(request_id, None) is None:
            return  # finished already
        pending = [a for a in self._adds if a.request_id != request_id]
        if len(pending) < len(self._adds):
            self._adds = pending  # never reached the engine
        else:
            self._aborts.append(request_id)
            self._wake.set()

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not (self._busy or self._adds or self._aborts):
                self._wake.clear()
                await self._wake.wait()
            adds, aborts = self._adds, self._aborts
            self._adds, self._aborts = [], []
            try:
                result = await loop.run_in_executor(self._executor, self._step, adds, aborts)
            except Exception as exc:  # an engine bug: fail everyone, report unhealthy
                log.exception("Engine step failed")
                self._fail_all(exc)
                return
            self._busy = result.busy
            self._dispatch(result)
            self._on_stats(result.stats)

    def _step(self, adds: list[_Add], aborts: list[str]) -> _StepResult:
        # runs on the engine thread
        engine = self.engine
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
        return _StepResult(outputs, failed, engine.stats(), engine.has_unfinished_requests())

    def _dispatch(self, result: _StepResult) -> None:
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

    def _fail_all(self, exc: BaseException) -> None:
        self.error = exc
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(exc)
