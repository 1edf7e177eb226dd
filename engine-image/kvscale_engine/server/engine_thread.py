"""The engine's own thread: it steps the engine back to back and hands each step's outputs over.

Every engine call (add, abort, step, stats) runs on one thread, so the engine needs no locks and
the event loop stays free to accept connections and stream tokens while a step runs. Requests,
aborts and calls that arrive during a step are applied before the next one; each request's
outputs go to its own asyncio queue. The thread starts the next step as soon as one ends and
posts the results to the event loop (`call_soon_threadsafe`) rather than waiting for the loop
to take them and ask for another step: that round trip each step waited for the loop to wake up
and for its thread to let go of the GIL.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

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
        self._streams: dict[str, asyncio.Queue[Item]] = {}  # the event loop's alone
        self._work = threading.Condition()  # guards what follows, handed to the engine's thread
        self._adds: list[_Add] = []
        self._aborts: list[str] = []
        self._calls: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-steps", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Ends the engine's thread after the step it is in (if any)."""
        with self._work:
            self._stopping = True
            self._work.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        with self._work:
            calls, self._calls = self._calls, []
        for _, future in calls:
            future.cancel()

    async def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread, between steps."""
        if self.error is not None:
            raise RuntimeError("the engine failed earlier") from self.error
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._work:
            self._calls.append((fn, future))
            self._work.notify()
        return await future

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
        add = _Add(
            request_id, prompt_token_ids, params, priority, arrival_time, traffic_class, preemptible
        )
        with self._work:
            self._adds.append(add)
            self._work.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request; the engine frees its KV blocks before its next step."""
        if self._streams.pop(request_id, None) is None:
            return  # finished already
        with self._work:
            pending = [a for a in self._adds if a.request_id != request_id]
            if len(pending) < len(self._adds):
                self._adds = pending  # never reached the engine
            else:
                self._aborts.append(request_id)
                self._work.notify()

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def _run(self) -> None:
        # the engine's thread: steps back to back while there is work, each step's results
        # handed to the event loop without waiting for it
        loop = self._loop
        assert loop is not None
        busy = False
        while True:
            with self._work:
                while not (busy or self._adds or self._aborts or self._calls or self._stopping):
                    self._work.wait()
                if self._stopping:
                    return
                adds, aborts, calls = self._adds, self._aborts, self._calls
                self._adds, self._aborts, self._calls = [], [], []
            for fn, future in calls:
                _call(loop, fn, future)
            if not (busy or adds or aborts):
                continue
            try:
                result = self._step(adds, aborts)
            except Exception as exc:  # an engine bug: fail everyone, report unhealthy
                log.exception("Engine step failed")
                _post(loop, self._fail_all, exc)
                return
            busy = result.busy
            if not _post(loop, self._deliver, result):
                return  # the event loop is gone

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

    def _deliver(self, result: _StepResult) -> None:
        # on the event loop
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

    def _fail_all(self, exc: BaseException) -> None:
        self.error = exc
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put_nowait(exc)
        with self._work:
            calls, self._calls = self._calls, []
        for _, future in calls:
            if not future.done():
                future.set_exception(RuntimeError("the engine failed"))


def _call(
    loop: asyncio.AbstractEventLoop, fn: Callable[[], Any], future: asyncio.Future[Any]
) -> None:
    """Runs fn here (the engine's thread) and settles its future on the event loop."""
    try:
        outcome: tuple[Any, BaseException | None] = (fn(), None)
    except Exception as exc:  # the caller's to handle
        outcome = (None, exc)
    _post(loop, _settle, future, *outcome)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up waiting
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> bool:
    """fn(*args) on the event loop, soon; False when the loop has closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True
