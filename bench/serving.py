"""A server in a child process, for the benchmarks that go through HTTP: ours, or vLLM's."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.machine import tree_cpu_seconds
from kvscale_cluster.ports import free_port


@dataclass(frozen=True)
class EngineProcess:
    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU time the server has used so far: its process and its children (the engine's
        process), every thread, user + system."""
        return tree_cpu_seconds(self.pid)


@contextmanager
def engine_server(
    model: Path, *args: str, name: str = "bench", torch_threads: int | None = None
) -> Iterator[str]:
    """Start `kvscale-engine serve` on a free loopback port; yield its base URL once ready."""
    with engine_process(model, *args, name=name, torch_threads=torch_threads) as process:
        yield process.url


@contextmanager
def engine_process(
    model: Path, *args: str, name: str = "bench", torch_threads: int | None = None
) -> Iterator[EngineProcess]:
    """`engine_server`, yielding the process too (for its CPU time)."""
    port = free_port()
    admin_port = next(p for p in iter(free_port, None) if p != port)
    cmd = [
        sys.executable, "-m", "kvscale_engine.cli", "serve", "--model", str(model),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--admin-port", str(admin_port),
        "--device", "cpu", "--log-level", "warning", *args,
    ]  # fmt: skip
    env = dict(os.environ)
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = str(torch_threads)
    with served(cmd, env, port, "/ready", 180) as process:
        yield process


@contextmanager
def vllm_process(
    venv: Path, model: Path, *args: str, name: str = "bench", env: dict[str, str] | None = None
) -> Iterator[EngineProcess]:
    """vLLM's OpenAI server from its own venv (e2e/vllm/install.sh), ready to serve; `env` adds
    to this process's environment (VLLM_CPU_KVCACHE_SPACE, OMP_NUM_THREADS)."""
    port = free_port()
    cmd = [
        str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log", *args,
    ]  # fmt: skip
    # its own venv: none of our source folders on its path
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with served(cmd, base | (env or {}), port, "/v1/models", 600) as process:
        yield process


@contextmanager
def served(
    cmd: list[str],
    env: dict[str, str],
    port: int,
    ready_path: str = "/ready",
    start_s: float = 180,
    what: str = "server",
) -> Iterator[EngineProcess]:
    """`cmd` as a child process serving on loopback `port`, yielded once `ready_path` answers 200
    and stopped (terminated, killed after 60 s) afterwards. Its output goes to a file (a pipe
    nobody reads would block a chatty child) whose tail is shown when it fails to start."""
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + start_s
            while not _ready(url + ready_path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    err = log.read().decode(errors="replace")[-3000:]
                    raise RuntimeError(f"{what} did not start:\n{err}")
                time.sleep(0.1)
            yield EngineProcess(url, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
