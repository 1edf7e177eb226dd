"""An engine server in a child process, for the benchmarks that go through HTTP."""

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

from bench.machine import cpu_seconds
from kvscale_cluster.ports import free_port


@dataclass(frozen=True)
class EngineProcess:
    url: str
    pid: int

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far (all its threads, user + system)."""
        return cpu_seconds(self.pid)


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
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "kvscale_engine.cli", "serve", "--model", str(model),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--admin-port", str(admin_port),
        "--device", "cpu", "--log-level", "warning", *args,
    ]  # fmt: skip
    with tempfile.TemporaryFile() as log:
        env = dict(os.environ)
        if torch_threads is not None:
            env["OMP_NUM_THREADS"] = str(torch_threads)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 180
            while not _ready(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"server did not start:\n{log.read().decode()[-3000:]}")
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
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
