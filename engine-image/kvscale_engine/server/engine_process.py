"""The engine in a child process of its own (`kvscale-engine serve`), as vLLM runs its engine core.

The server's process keeps HTTP, JSON, SSE and the metrics; the child only steps the engine. In
one process the two shared a GIL: every torch call and C kernel of a step gives the GIL up, and
at 64 requests in flight the engine thread waited for it while the event loop streamed the step
before (0.3 s in a 4.5 s run on a 2-core Xeon, on top of 1.7 ms p50 between steps).

The parent sends ("add", Add), ("abort", request_id), ("stats",) and ("stop",) through one pipe
(a sender thread writes, so a full pipe never blocks the event loop). The child reads whatever
has arrived before every step, steps, and sends ("step", StepResult) through another pipe, which
the event loop reads when it is readable; ("ready", stats), ("stats", stats) and
("failed", traceback) answer the rest. A step's outputs cross as deltas (the new tokens and text,
see `_Delta`), and the parent rebuilds each request's full RequestOutput: sending whole token
lists and texts every step would cost O(length) per token.

A child that dies (killed, out of memory) fails every request in flight and turns /health false,
as an engine bug does. A child whose parent died exits within a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import queue
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.outputs import EngineStats, RequestOutput
from kvscale_engine.engine.tokenizer import load_tokenizer
from kvscale_engine.model_config import ModelConfig
from kvscale_engine.server.engine_runner import Add, EngineRunner, StepResult, step_once

if TYPE_CHECKING:  # imported by the child only: the server's process never imports torch
    from kvscale_engine.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 30.0  # for the step in progress to end once asked to stop
PARENT_CHECK_S = 1.0  # how often an idle child checks that its parent lives

# what crosses from the child for each output: RequestOutput less the full token list and text
_Delta = tuple[str, list[int], str, bool, Any, int, int, "float | None"]


class EngineFailed(RuntimeError):
    """The engine process failed: a step raised, it could not load, or it exited."""


@dataclass
class _Sofar:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""


class EngineProcess(EngineRunner):
    def __init__(self, config: EngineConfig, on_stats: Callable[[EngineStats], None]) -> None:
        super().__init__(on_stats)
        self.config = config
        self.tokenizer = load_tokenizer(config)
        self.vocab_size = ModelConfig.from_source(config.model_source).vocab_size
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads
        inbox, self._requests = ctx.Pipe(duplex=False)
        self._reader, outbox = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=serve_engine,
            args=(config, inbox, outbox, logging.getLogger().level),
            name="kvscale-engine-core",
            daemon=True,
        )
        self._child_ends: list[Connection] = [inbox, outbox]
        self._unsent: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name="engine-sender", daemon=True)
        self._sofar: dict[str, _Sofar] = {}
        self._ready: asyncio.Future[EngineStats] | None = None
        self._stats_waiters: list[asyncio.Future[EngineStats]] = []
        self._stopping = False
        self._reading = False

    @property
    def pid(self) -> int | None:
        return self._process.pid

    async def start(self) -> EngineStats:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        await asyncio.to_thread(self._process.start)
        for end in self._child_ends:
            end.close()  # the child holds its own copies: EOF here once the child is gone
        self._sender.start()
        loop.add_reader(self._reader.fileno(), self._on_readable)
        self._reading = True
        try:
            return await self._ready
        except BaseException:  # failed to load, or the load was cancelled
            await self.stop()
            raise

    async def stop(self) -> None:
        """Ask the child to stop after its step in progress (kill it if it does not, or if it is
        still loading: nothing to finish there), then close the pipes."""
        self._stopping = True
        if self._process.pid is None:
            return  # never started
        loaded = self._ready is not None and self._ready.done() and not self._ready.cancelled()
        if self._process.is_alive() and loaded:
            self._unsent.put(("stop",))
            await asyncio.to_thread(self._process.join, STOP_TIMEOUT_S)
            if self._process.is_alive():
                log.warning("The engine process did not stop in %.0f s; killing it", STOP_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            await asyncio.to_thread(self._process.join)
        self._close(EngineFailed("the engine process stopped"))
        self._reader.close()

    async def stats(self) -> EngineStats:
        if self.error is not None:
            raise EngineFailed("the engine process failed earlier") from self.error
        waiter: asyncio.Future[EngineStats] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(waiter)
        self._unsent.put(("stats",))
        return await waiter

    def _submit(self, add: Add) -> None:
        self._sofar[add.request_id] = _Sofar()
        self._unsent.put(("add", add))

    def _cancel(self, request_id: str) -> None:
        self._sofar.pop(request_id, None)
        self._unsent.put(("abort", request_id))

    def _on_readable(self) -> None:
        try:
            while self._reader.poll():
                kind, payload = self._reader.recv()
                self._handle(kind, payload)
        except (EOFError, OSError):
            if not self._stopping:  # else stop() joins it
                self._process.join(0.5)  # it closed its end: reaped at once, for its exit code
            code = self._process.exitcode
            why = "exited" if code is None else f"exited with code {code}"
            self._close(EngineFailed(f"the engine process {why}"))

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "step":
            self.deliver(self._expand(payload))
        elif kind == "stats":
            _settle(self._stats_waiters.pop(0), payload)
        elif kind == "ready":
            assert self._ready is not None
            _settle(self._ready, payload)
        elif kind == "failed":
            log.error("The engine process failed:\n%s", payload)
            self._close(EngineFailed(str(payload).strip().splitlines()[-1]))

    def _expand(self, wire: tuple[list[_Delta], list[tuple[str, BaseException]], EngineStats, bool]
                ) -> StepResult:  # fmt: skip
        deltas, failed, stats, busy = wire
        outputs = []
        for request_id, new, delta, finished, reason, prompt, cached, scheduled in deltas:
            sofar = self._sofar.get(request_id)
            if sofar is None:
                continue  # aborted while the step ran
            sofar.token_ids += new
            sofar.text += delta
            if finished:
                del self._sofar[request_id]
            outputs.append(
                RequestOutput(
                    request_id=request_id,
                    new_token_ids=new,
                    output_token_ids=sofar.token_ids,
                    delta_text=delta,
                    text=sofar.text,
                    finished=finished,
                    finish_reason=reason,
                    num_prompt_tokens=prompt,
                    num_cached_tokens=cached,
                    first_scheduled_time=scheduled,
                )
            )
        for request_id, _ in failed:
            self._sofar.pop(request_id, None)
        return StepResult(outputs, failed, stats, busy)

    def _close(self, why: BaseException) -> None:
        # the child is gone: whoever still waits on it gets `why`
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._reader.fileno())
            self._reading = False
        waiters = [self._ready] if self._ready is not None else []
        waiters += self._stats_waiters
        self._stats_waiters = []
        for waiter in waiters:
            if waiter is not None and not waiter.done():
                waiter.set_exception(why)
        if not self._stopping and self.error is None:
            self.fail_all(why)
        self._sofar.clear()
        if self._sender.is_alive():
            self._unsent.put(None)

    def _send_loop(self) -> None:
        # the sender thread: pickling and writing, which may block while the child steps
        try:
            while (message := self._unsent.get()) is not None:
                self._requests.send(message)
        except OSError:
            pass  # the child is gone; the reader reports it
        finally:
            self._requests.close()


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():  # its caller may have been cancelled
        future.set_result(value)


# the child


def serve_engine(
    config: EngineConfig, inbox: Connection, outbox: Connection, log_level: int
) -> None:
    """The child's main: load the engine, then step it while there is work.

    SIGTERM and SIGINT sent to the whole process group (a terminal's Ctrl-C, `timeout`) are the
    server's to act on: it drains, then stops this process through the pipe.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s"
    )
    parent = os.getppid()
    try:
        from kvscale_engine.engine.llm_engine import LLMEngine

        engine = LLMEngine(config)
        # torch and the model out of the collector's reach: a full collection then walks only
        # what stepping allocated since (state.freeze_heap does the same in the server's process)
        gc.collect()
        gc.freeze()
        outbox.send(("ready", engine.stats()))
        _step_loop(engine, inbox, outbox, parent)
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return  # the parent is gone
    except Exception:
        log.exception("Engine failed")
        with contextlib.suppress(OSError):  # the parent may be gone too
            outbox.send(("failed", traceback.format_exc()))


def _step_loop(engine: LLMEngine, inbox: Connection, outbox: Connection, parent: int) -> None:
    busy = False
    while True:
        if not busy:
            _wait(inbox, parent)
        messages = []
        while inbox.poll():
            messages.append(inbox.recv())
        adds: list[Add] = []
        aborts: list[str] = []
        for message in messages:
            kind = message[0]
            if kind == "add":
                adds.append(message[1])
            elif kind == "abort":
                aborts.append(message[1])
            elif kind == "stats":
                outbox.send(("stats", engine.stats()))
            elif kind == "stop":
                return
        if not (busy or adds or aborts):
            continue
        result = step_once(engine, adds, aborts)
        busy = result.busy
        deltas = [
            (o.request_id, o.new_token_ids, o.delta_text, o.finished, o.finish_reason,
             o.num_prompt_tokens, o.num_cached_tokens, o.first_scheduled_time)
            for o in result.outputs
        ]  # fmt: skip
        outbox.send(("step", (deltas, result.failed, result.stats, busy)))


def _wait(inbox: Connection, parent: int) -> None:
    """Until a message arrives; exits the process once its parent has gone."""
    while not inbox.poll(PARENT_CHECK_S):
        if os.getppid() != parent:
            raise SystemExit(0)
