"""The engine in the server's own process, on a thread of its own (tests, and apps built around an
engine object; `kvscale-engine serve` runs it in a child process: engine_process.py).

Every engine call (add, abort, step, stats) runs on one worker thread, so the engine needs no
locks and the event loop stays free to accept connections and stream tokens while a step runs.
Requests and aborts that arrive during a step are applied before the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

from kvscale_engine.engine.outputs import EngineStats
from kvscale_engine.server.engine_runner import Add, EngineRunner, StepResult, step_once

if TYPE_CHECKING:
    from kvscale_engine.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineThread(EngineRunner):
    def __init__(self, engine: LLMEngine, on_stats: Callable[[EngineStats], None]) -> None:
        super().__init__(on_stats)
        self.engine = engine
        self.config = engine.config
        self.tokenizer = engine.tokenizer
        self.vocab_size = engine.model_config.vocab_size
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-step")
        self._adds: list[Add] = []
        self._aborts: list[str] = []
        self._busy = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> EngineStats:
        self._task = asyncio.create_task(self._run(), name="engine-steps")
        return await self.stats()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def stats(self) -> EngineStats:
        return await self.call(self.engine.stats)

    async def call(self, fn: Callable[[], T]) -> T:
        """Run fn on the engine thread, between steps."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _submit(self, add: Add) -> None:
        self._adds.append(add)
        self._wake.set()

    def _cancel(self, request_id: str) -> None:
        pending = [a for a in self._adds if a.request_id != request_id]
        if len(pending) < len(self._adds):
            self._adds = pending  # never reached the engine
        else:
            self._aborts.append(request_id)
            self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not (self._busy or self._adds or self._aborts):
                self._wake.clear()
                await self._wake.wait()
            adds, aborts = self._adds, self._aborts
            self._adds, self._aborts = [], []
            try:
                result: StepResult = await loop.run_in_executor(
                    self._executor, step_once, self.engine, adds, aborts
                )
            except Exception as exc:  # an engine bug: fail everyone, report unhealthy
                log.exception("Engine step failed")
                self.fail_all(exc)
                return
            self._busy = result.busy
            self.deliver(result)
