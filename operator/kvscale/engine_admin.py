"""Draining a scale-in victim: the operator's side of the engine's admin API.

`POST /drain` makes the replica refuse new work and turns its readiness false (so Services and
routers stop sending to it); `GET /drain` says how many requests are still in flight; `POST
/undrain` cancels an aborted scale-in. Only kvscale engines have it: for vLLM the victim is
removed at once and its preStop/SIGTERM handling is vLLM's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from kvscale.children.engine_args import ADMIN_PORT

TIMEOUT_S = 5.0


@dataclass(frozen=True)
class DrainState:
    in_flight: int
    queued: int
    drained: bool

    @property
    def busy(self) -> int:
        """Requests the replica still owes an answer: admitted or waiting for admission."""
        return self.in_flight + self.queued


def _url(ip: str, path: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{ADMIN_PORT}{path}"


async def _call(client: httpx.AsyncClient, method: str, ip: str, path: str) -> DrainState:
    response = await client.request(method, _url(ip, path), timeout=TIMEOUT_S)
    response.raise_for_status()
    body = response.json()
    in_flight, queued = int(body.get("in_flight", 0)), int(body.get("queued", 0))
    return DrainState(in_flight, queued, bool(body.get("drained", in_flight == 0)))


async def start(client: httpx.AsyncClient, ip: str) -> DrainState:
    return await _call(client, "POST", ip, "/drain")


async def status(client: httpx.AsyncClient, ip: str) -> DrainState:
    return await _call(client, "GET", ip, "/drain")


async def cancel(client: httpx.AsyncClient, ip: str) -> DrainState:
    return await _call(client, "POST", ip, "/undrain")
