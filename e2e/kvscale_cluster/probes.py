"""Probes and lifecycle hooks run by the process kubelet: httpGet, tcpSocket and exec."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .netns import PodAddress
from .pod_env import named_port

Obj = dict[str, Any]


def run_action(
    action: Obj, container: Obj, address: PodAddress, env: Mapping[str, str], timeout: float
) -> bool:
    """Run one probe or hook action; True when it succeeds within ``timeout`` seconds."""
    if "httpGet" in action:
        get = action["httpGet"]
        host = get.get("host") or address.ip
        port = named_port(container, get["port"])
        scheme = str(get.get("scheme", "HTTP")).lower()
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
        try:
            response = httpx.get(url, headers=headers, timeout=timeout, verify=False)
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 400
    if "tcpSocket" in action:
        tcp = action["tcpSocket"]
        port = named_port(container, tcp["port"])
        try:
            with socket.create_connection((tcp.get("host") or address.ip, port), timeout=timeout):
                return True
        except OSError:
            return False
    if "exec" in action:
        argv: Sequence[str] = action["exec"]["command"]
        try:
            done = subprocess.run(
                address.wrap(argv),
                env=dict(env),
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except (subprocess.TimeoutExpired, OSError):
            return False
        return done.returncode == 0
    if "sleep" in action:
        time.sleep(min(float(action["sleep"]["seconds"]), timeout))
        return True
    return False


@dataclass
class ProbeState:
    """Bookkeeping for one probe of one container run."""

    spec: Obj
    started: float
    successes: int = 0
    failures: int = 0
    last_run: float = 0.0
    result: bool | None = None  # None until the first probe decides

    def due(self, now: float) -> bool:
        delay = float(self.spec.get("initialDelaySeconds", 0))
        period = float(self.spec.get("periodSeconds", 10))
        return now - self.started >= delay and now - self.last_run >= period

    def record(self, ok: bool, now: float) -> None:
        self.last_run = now
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.result = False

    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))
