"""The server's admission bookkeeping around a real engine: no slot leaks, whatever fails."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.sampling_params import SamplingParams
from kvscale_engine.server.admission_queue import Refused
from kvscale_engine.server.config import ServerConfig
from kvscale_engine.server.metrics import EngineMetrics
from kvscale_engine.server.state import ServerState

PARAMS = SamplingParams(temperature=0.0, max_tokens=4)


def _state() -> ServerState:
    config = ServerConfig(served_model_name="tiny", max_model_len=512, max_concurrency=2)
    return ServerState(config, EngineMetrics("tiny", 512, config.class_names, "0"))


async def _fail_engine(state: ServerState, engine: LLMEngine) -> None:
    """Make the next engine step raise, as an engine bug would, and wait for the loop to fail."""

    def broken(*_: Any) -> list[int]:
        raise RuntimeError("kernel exploded")

    engine.model_runner.run = broken  # type: ignore[method-assign]
    stream = state.runner.add("victim", [1, 2, 3], PARAMS, 0, 0.0)
    assert isinstance(await stream.get(), RuntimeError)


def test_a_request_admitted_before_the_engine_failed_gives_its_slot_back(
    make_engine: Callable[..., LLMEngine],
) -> None:
    async def scenario() -> None:
        state = _state()
        engine = make_engine()
        await state.load(engine)
        try:
            admitted = await state.admit(None, 16)
            assert state.queue.controller.in_flight == 1
            await _fail_engine(state, engine)
            try:
                state.generate(admitted, [5, 6, 7], [PARAMS, PARAMS])
            except RuntimeError:
                pass
            else:
                raise AssertionError("adding to a failed engine should raise")
            assert state.queue.controller.in_flight == 0 and state.active == 0
            assert await state.wait_idle(1.0)  # a drain would not hang on a ghost request
        finally:
            await state.close()

    asyncio.run(scenario())


def test_a_refused_engine_request_gives_its_slot_back(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """The engine refuses in its own thread (a prompt past the KV pool): the slot comes back."""

    async def scenario() -> None:
        state = _state()
        await state.load(make_engine(num_kv_blocks=4))
        try:
            admitted = await state.admit(None, 16)
            gen = state.generate(admitted, list(range(5, 100)), [PARAMS])
            try:
                async for _ in gen.events():
                    pass
            except ValueError as exc:
                assert "KV blocks" in str(exc)
            else:
                raise AssertionError("the engine should refuse a prompt past its pool")
            finally:
                gen.close()
            assert state.queue.controller.in_flight == 0 and state.active == 0
        finally:
            await state.close()

    asyncio.run(scenario())


def test_a_drain_asked_for_while_loading_holds_once_loaded(
    make_engine: Callable[..., LLMEngine],
) -> None:
    async def scenario() -> None:
        state = _state()
        state.start_draining()  # the operator drained a replica that was still starting
        await state.load(make_engine())
        try:
            assert not state.ready and state.status == "draining"
            try:
                await state.admit(None, 16)
            except Refused as refused:
                assert (refused.status, refused.reason) == (503, "draining")
            else:
                raise AssertionError("a draining replica admitted a request")
            assert state.stop_draining() and state.ready
            state.queue.release(await state.admit(None, 16))
        finally:
            await state.close()

    asyncio.run(scenario())


def test_a_generation_teaches_admission_its_time_to_first_token(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """What the queue's deadline check adds to its predicted wait comes from served requests."""

    async def scenario() -> None:
        state = _state()
        await state.load(make_engine())
        try:
            controller = state.queue.controller
            assert controller.first_token_s == 0.0
            admitted = await state.admit(None, 16)
            gen = state.generate(admitted, [5, 6, 7], [PARAMS, PARAMS])
            try:
                async for _ in gen.events():
                    pass
            finally:
                gen.close()
            assert admitted.first_token_at is not None
            assert 0.0 < controller.first_token_s <= admitted.first_token_at - admitted.arrival
            assert controller.in_flight == 0
        finally:
            await state.close()

    asyncio.run(scenario())


def test_loading_freezes_the_heap_and_closing_gives_it_back(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """What is alive once the engine is loaded (torch, the model, the modules) is out of the
    collector's reach while the server runs, so a full collection walks only what serving
    allocated; closing returns it."""

    async def scenario() -> None:
        gc.unfreeze()
        state = _state()
        await state.load(make_engine())
        try:
            assert gc.get_freeze_count() > 10_000  # torch's and the engine's objects at least
            admitted = await state.admit(None, 16)
            gen = state.generate(admitted, [5, 6, 7], [PARAMS])
            async for _ in gen.events():
                pass
            gen.close()
        finally:
            await state.close()
        assert gc.get_freeze_count() == 0

    asyncio.run(scenario())
