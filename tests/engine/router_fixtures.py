"""A live router (`kvscale-router --replicas ...`) as a real process, for the router tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from server_fixtures import parse_samples

from kvscale_cluster.ports import free_port
from kvscale_cluster.wait import GiveUp, wait_for


@dataclass
class LiveRouter:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    weights_path: Path

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        samples: dict[str, float] = parse_samples(httpx.get(f"{self.url}/metrics", timeout=10).text)
        return samples

    def metric(self, name: str, **labels: str) -> float:
        key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return self.metrics().get(f"{name}{{{key}}}", 0.0)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Publish weights as the operator would, and wait until the router routes with them."""
        self.weights_path.write_text(json.dumps({"weights": dict(weights), "reason": "test"}))
        self.process.send_signal(signal.SIGHUP)

        def applied() -> bool:
            return all(
                self.metric("kvscale_router:replica_weight", replica=name) == value
                for name, value in weights.items()
            )

        wait_for(applied, 30, f"the router to route with weights {dict(weights)}")


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise GiveUp(f"router exited with {process.returncode} before it was ready")
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def live_router(
    replicas: Mapping[str, str],
    tmp_dir: Path,
    *args: str,
    weights: Mapping[str, float] | None = None,
) -> Iterator[LiveRouter]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_dir / f"router-{port}.log"
    weights_path = tmp_dir / f"weights-{port}.json"
    weights_path.write_text(json.dumps({"weights": dict(weights or {})}))
    spec = ",".join(f"{name}={address}" for name, address in replicas.items())
    cmd = [
        sys.executable, "-m", "kvscale_router.cli", "--host", "127.0.0.1", "--port", str(port),
        "--replicas", spec, "--weights-file", str(weights_path), *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    router = LiveRouter(process, url, log_path, weights_path)
    try:
        wait_for(lambda: _ready(url, process), 60, "the router to become ready")
        yield router
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait(timeout=15)
