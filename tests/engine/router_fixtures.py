"""A live router (`kvscale-router --replicas ...`) as a real process, for the router tests."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from server_fixtures import LiveProcess, running

from kvscale_cluster.ports import free_port
from kvscale_cluster.wait import wait_for


@dataclass
class LiveRouter(LiveProcess):
    weights_path: Path

    def metric(self, name: str, **labels: str) -> float:
        key = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return self.metrics().get(f"{name}{{{key}}}", 0.0)

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Publish weights as the operator would, and wait until the router routes with them."""
        self.weights_path.write_text(json.dumps({"weights": dict(weights), "reason": "test"}))
        self.process.send_signal(signal.SIGHUP)

        def applied() -> bool:
            return all(
                self.metric("kvscale_router_replica_weight", replica=name) == value
                for name, value in weights.items()
            )

        wait_for(applied, 30, f"the router to route with weights {dict(weights)}")


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
        "--replicas", spec, "--weights-file", str(weights_path),
        "--shutdown-grace-seconds", "0", *args,  # a test's own value comes later and wins
    ]  # fmt: skip
    with running(cmd, url, log_path, "router", 60, stop_s=15, PYTHONUNBUFFERED="1") as process:
        yield LiveRouter(process, url, log_path, weights_path)
