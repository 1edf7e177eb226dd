"""The engine in a child process (`EngineProcess`, what `kvscale-engine serve` runs): the same
outputs as the engine on a thread, its KV blocks freed on abort, and every way the child can end
(a stop, a failed load, a kill, the parent's death) reported, never hung on."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import BASE_ARGS, MODEL, live_server

from kvscale_cluster.ports import free_port
from kvscale_cluster.process import alive
from kvscale_cluster.wait import wait_for
from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.engine.outputs import EngineStats, RequestOutput
from kvscale_engine.sampling_params import SamplingParams
from kvscale_engine.server.engine_process import EngineFailed, EngineProcess
from kvscale_engine.server.engine_runner import EngineRunner, Item
from kvscale_engine.server.engine_thread import EngineThread

SETTINGS: dict[str, Any] = {"max_model_len": 512, "num_kv_blocks": 64, "block_size": 16,
                            "device": "cpu", "dtype": "float32"}  # fmt: skip
PROMPTS = [[5, 6, 7], list(range(10, 40)), [3] * 17]


def _config(model: Path | str, **overrides: Any) -> EngineConfig:
    return EngineConfig(model=str(model), **(SETTINGS | overrides))


def _ignore(_: EngineStats) -> None:
    pass


async def _generate(runner: EngineRunner, max_tokens: int) -> list[list[RequestOutput]]:
    """Every prompt at once, greedy; each request's outputs in order."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    streams = [
        runner.add(f"r{i}", prompt, params, 0, time.monotonic()) for i, prompt in enumerate(PROMPTS)
    ]

    async def read(stream: asyncio.Queue[Item]) -> list[RequestOutput]:
        outs: list[RequestOutput] = []
        while not outs or not outs[-1].finished:
            item = await stream.get()
            assert not isinstance(item, BaseException), item
            outs.append(item)
        return outs

    return list(await asyncio.gather(*(read(s) for s in streams)))


async def _served(runner: EngineRunner) -> tuple[list[list[RequestOutput]], EngineStats]:
    """Start the runner, generate 24 tokens for every prompt, read its stats, stop it."""
    await runner.start()
    try:
        return await _generate(runner, 24), await runner.stats()
    finally:
        await runner.stop()


def _final(outs: list[RequestOutput]) -> tuple[list[int], str, str | None]:
    last = outs[-1]
    return list(last.output_token_ids), last.text, last.finish_reason


@pytest.mark.parametrize("kv_blocks", [64, 6], ids=["roomy", "preempting"])
def test_outputs_match_the_engine_on_a_thread(llama_dir: Path, kv_blocks: int) -> None:
    """Deltas cross the pipe; the rebuilt outputs equal the in-process engine's, step by step,
    also when requests are preempted and recomputed (6 blocks for the 9 the requests grow to)."""

    async def scenario() -> None:
        config = _config(llama_dir, num_kv_blocks=kv_blocks)
        expected, thread_stats = await _served(EngineThread(LLMEngine(config), _ignore))
        got, stats = await _served(EngineProcess(config, _ignore))
        assert stats.num_preemptions == thread_stats.num_preemptions
        assert (stats.num_preemptions > 0) == (kv_blocks == 6)
        assert [_final(o) for o in got] == [_final(o) for o in expected]
        for g, e in zip(got, expected, strict=True):
            assert [o.new_token_ids for o in g] == [o.new_token_ids for o in e]
            assert "".join(o.delta_text for o in g) == g[-1].text
            assert all(len(o.output_token_ids) == 24 for o in g[-1:])
        assert stats.num_free_blocks == stats.num_total_blocks  # all finished, all freed
        assert stats.generation_tokens == 24 * len(PROMPTS)

    asyncio.run(scenario())


def test_an_abort_frees_the_blocks_and_a_refused_add_reports_why(llama_dir: Path) -> None:
    async def scenario() -> None:
        child = EngineProcess(_config(llama_dir), _ignore)
        total = (await child.start()).num_total_blocks
        try:
            params = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
            stream = child.add("long", list(range(1, 60)), params, 0, time.monotonic())
            first = await stream.get()
            assert isinstance(first, RequestOutput) and not first.finished
            child.abort("long")
            await wait_for_async(
                lambda: child.stats(), lambda s: s.num_free_blocks == total, "blocks freed"
            )
            assert child.num_streams == 0
            too_long = child.add("huge", [1] * 600, params, 0, time.monotonic())
            refused = await too_long.get()
            assert isinstance(refused, ValueError) and "max_model_len" in str(refused)
            assert child.error is None  # a refused request is not an engine failure
        finally:
            await child.stop()
        assert child.pid is not None and not alive(child.pid)

    asyncio.run(scenario())


async def wait_for_async(
    probe: Callable[[], Any], done: Callable[[Any], bool], what: str, timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done(await probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_model_that_does_not_load_fails_start_and_leaves_no_child(
    llama_dir: Path, tmp_path: Path
) -> None:
    """The parent reads the config and the tokenizer; the child loads the weights, and fails."""
    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")

    async def scenario() -> None:
        child = EngineProcess(_config(broken), _ignore)
        with pytest.raises(EngineFailed):
            await child.start()
        assert child.pid is not None and not alive(child.pid)
        with pytest.raises(EngineFailed):
            await child.stats()

    asyncio.run(scenario())


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _engine_child(pid: int) -> int:
    """The server's engine process: its one child that runs `serve_engine`."""
    for child in _children(pid):
        if b"multiprocessing.spawn" in Path(f"/proc/{child}/cmdline").read_bytes():
            return child
    raise AssertionError(f"no engine process under {pid}: {_children(pid)}")


def test_a_killed_engine_process_fails_requests_in_flight_and_health(
    llama_dir: Path, tmp_path: Path
) -> None:
    """As an out-of-memory kill would: the stream ends with an error, /health and /ready turn
    false, new requests get 503, and the server itself keeps answering."""
    with live_server(llama_dir, tmp_path) as server:
        engine = _engine_child(server.process.pid)
        body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True,
                "temperature": 0.0, "stream": True}  # fmt: skip
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{server.api}/completions", json=body) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert '"text"' in first
                os.kill(engine, signal.SIGKILL)
                rest = [line for line in lines if line.startswith("data: ")]
            assert any('"error"' in line and "engine process" in line for line in rest), rest
            assert rest[-1] == "data: [DONE]"
            wait_for(lambda: client.get(f"{server.url}/health").status_code != 200, 10, "unhealthy")
            assert client.get(f"{server.url}/ready").status_code == 503
            again = client.post(f"{server.api}/completions", json=body | {"stream": False})
            assert again.status_code == 503
            assert again.json()["error"]["code"] == "engine_failed"
        assert server.process.poll() is None  # the server lives on, reporting the failure
    assert "the engine process exited with code -9" in server.log()


def test_the_engine_process_exits_with_its_server(llama_dir: Path, tmp_path: Path) -> None:
    """A server killed outright (no shutdown) leaves no engine process behind; a server that
    stops cleanly stops it too, and leaks nothing."""
    with live_server(llama_dir, tmp_path) as server:
        engine = _engine_child(server.process.pid)
        server.process.kill()
        server.process.wait(timeout=30)
        wait_for(lambda: not alive(engine), 10, "the orphaned engine process to exit")
    with live_server(llama_dir, tmp_path, "--shutdown-grace", "0") as server:
        engine = _engine_child(server.process.pid)
        server.sigterm()
        assert server.process.wait(timeout=60) in (0, -15), server.log()  # uvicorn re-raises it
        assert not alive(engine)
    assert "leaked" not in server.log() and "Traceback" not in server.log()


def test_a_sigterm_to_the_whole_group_drains_before_the_engine_stops(
    llama_dir: Path, tmp_path: Path
) -> None:
    """`timeout`, a terminal's Ctrl-C or a container runtime may signal every process of the
    server at once: the engine process leaves it to the server, which serves what it admitted
    through the grace delay and the drain, then stops the engine."""
    port, admin = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "kvscale_engine.cli", "serve", "--model", str(llama_dir),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--admin-port", str(admin), "--device", "cpu", "--shutdown-grace", "1", *BASE_ARGS,
    ]  # fmt: skip
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    try:
        wait_for(lambda: _answers(f"{url}/ready"), 120, "the server to become ready")
        body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": True,
                "temperature": 0.0, "stream": True}  # fmt: skip
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", f"{url}/v1/completions", json=body) as resp,
        ):
            lines = resp.iter_lines()
            next(line for line in lines if line.startswith("data: "))
            os.killpg(process.pid, signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert '"finish_reason":"length"' in rest[-2] and rest[-1] == "data: [DONE]", rest[-3:]
        assert process.wait(timeout=60) in (0, -15)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log_path.read_text(errors="replace")
    assert "Drain finished" in text and "engine process exited" not in text, text


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
