"""A live engine server as a real process (`kvscale-engine serve`), for the server tests.

Tests talk to it over HTTP only, as a client in production would; waits are on conditions (the
server answering /ready, a metric reaching a value) with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvscale_cluster.ports import free_port
from kvscale_cluster.wait import GiveUp, wait_for

MODEL = "tiny-llama"
BASE_ARGS = ("--max-model-len", "512", "--num-kv-blocks", "256", "--block-size", "16")


@dataclass
class LiveServer:
    process: subprocess.Popen[bytes]
    url: str
    admin_url: str  # POST /drain, GET /drain, POST /undrain
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Every sample on /metrics as `name{label="v",...}` -> value (labels sorted)."""
        return parse_samples(httpx.get(f"{self.url}/metrics", timeout=10).text)

    def sigterm(self) -> None:
        self.process.send_signal(signal.SIGTERM)


def parse_samples(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise GiveUp(f"server exited with {process.returncode} before it was ready")
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def live_server(model_dir: Path, tmp_dir: Path, *args: str) -> Iterator[LiveServer]:
    port = free_port()
    admin_port = next(p for p in iter(free_port, None) if p != port)
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_dir / f"server-{port}.log"
    cmd = [
        sys.executable, "-m", "kvscale_engine.cli", "serve",
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin_port),
        "--device", "cpu", *BASE_ARGS, *args,
    ]  # fmt: skip
    # one torch thread, as the engine tier runs in-process: tiny models, shared CI cores
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = LiveServer(process, url, f"http://127.0.0.1:{admin_port}", log_path)
    try:
        wait_for(lambda: _ready(url, process), 120, "the server to become ready")
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
