"""A live engine server as a real process (`kvscale-engine serve`), for the server tests.

Tests talk to it over HTTP only, as a client in production would; waits are on conditions (the
server answering /ready, a metric reaching a value) with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvscale_cluster.ports import free_port
from kvscale_cluster.wait import GiveUp, wait_for

MODEL = "tiny-llama"
BASE_ARGS = ("--max-model-len", "512", "--num-kv-blocks", "256", "--block-size", "16")


@dataclass
class LiveProcess:
    """One of our servers as a real process: where it listens, its log, its /metrics."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Every sample on /metrics as `name{label="v",...}` -> value (labels sorted)."""
        return parse_samples(httpx.get(f"{self.url}/metrics", timeout=10).text)


@dataclass
class LiveServer(LiveProcess):
    admin_url: str  # POST /drain, GET /drain, POST /undrain

    def sigterm(self) -> None:
        self.process.send_signal(signal.SIGTERM)


def parse_samples(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def _ready(url: str, process: subprocess.Popen[bytes], what: str) -> bool:
    if process.poll() is not None:
        raise GiveUp(f"{what} exited with {process.returncode} before it was ready")
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def running(
    cmd: list[str],
    url: str,
    log_path: Path,
    what: str,
    ready_s: float,
    stop_s: float = 0.0,
    **env: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `cmd` (output to `log_path`) and wait for `url`/ready; at the end, stop it.

    Stopping is SIGTERM and up to `stop_s` seconds to exit (none: at once), then SIGKILL.
    """
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    try:
        wait_for(lambda: _ready(url, process, what), ready_s, f"the {what} to become ready")
        yield process
    finally:
        if process.poll() is None and stop_s > 0:
            process.terminate()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=stop_s)
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


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
    env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with running(cmd, url, log_path, "server", 120, **env) as process:
        yield LiveServer(process, url, log_path, f"http://127.0.0.1:{admin_port}")


def raw_get(sock: socket.socket, path: str) -> tuple[str, dict[str, str]]:
    """One HTTP/1.1 GET on an open connection, its body read to the end (so the connection can
    serve the next one): the status line and the headers, names lower-cased."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the connection instead of answering"
        head += chunk
    raw, _, body = head.partition(b"\r\n\r\n")
    status, *lines = raw.decode().split("\r\n")
    headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines)}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(4096)
    return status, headers
