"""A kube-proxy for the local cluster: Service ClusterIPs routed to Ready endpoints, and cluster
DNS, driven by Services and EndpointSlices watched through the API.

Why userspace: NAT rules, ``ip_forward`` and ``br_netfilter`` are machine-wide, shared by every
cluster (and agent) on it. Instead each
cluster's Service range (10.96.N.0/24 for slot N) is routed as *local* on its bridge
(``netns.py``), so the host owns every ClusterIP and pods reach them through their default route.
This process listens on ``ClusterIP:port`` for each TCP Service port that has a Ready endpoint
and forwards each connection to one (round robin; the next one when a connect fails). A Service
port without Ready endpoints has no listener, so connecting is refused at once, as kube-proxy's
REJECT rule does. Backends see the bridge address as the client (like masquerading); session
affinity, NodePorts, UDP Services and ``internalTrafficPolicy`` are not implemented.

It also serves DNS on ``<bridge address>:53`` (``cluster_dns.py``). Run as
``python -m kvscale_cluster.kube_proxy``; the launcher starts it after the kubelet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import logging
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from . import process
from .cluster_dns import ClusterDns
from .kube_api import Obj
from .service_table import Address, Key, Route, dns_records, object_key, routes
from .wait import GiveUp, wait_for

log = logging.getLogger("kvscale.kube_proxy")
CONNECT_SECONDS = 3.0
RETRY_SECONDS = 1.0
CHUNK = 65536
DNS_PORT = 53


class WatchExpired(Exception):
    """The watch's resourceVersion is gone: list again."""


class Watch:
    """List-then-watch of one resource into ``store``; ``changed`` is called after each change."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        path: str,
        changed: Callable[[], None],
        key: Callable[[Obj], Key] = object_key,
    ) -> None:
        self.http = http
        self.path = path
        self.changed = changed
        self.key = key
        self.store: dict[Key, Obj] = {}
        self.synced = False

    async def run(self) -> None:
        version: str | None = None
        while True:
            try:
                version = await (self._list() if version is None else self._watch(version))
            except WatchExpired:
                version = None
            except (httpx.HTTPError, ValueError, KeyError) as error:
                log.warning("Watch of %s failed (%r); listing again", self.path, error)
                version = None
                await asyncio.sleep(RETRY_SECONDS)

    async def _list(self) -> str:
        response = await self.http.get(self.path)
        response.raise_for_status()
        listed = response.json()
        self.store = {self.key(item): item for item in listed["items"]}
        self.synced = True
        self.changed()
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> str:
        params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
        timeout = httpx.Timeout(10.0, read=None)
        async with self.http.stream("GET", self.path, params=params, timeout=timeout) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise WatchExpired(obj.get("message", ""))
                version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.store.pop(self.key(obj), None)
                else:
                    self.store[self.key(obj)] = obj
                self.changed()
        return version


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close ``sink``; a reset aborts ``sink``."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, RuntimeError):
        sink.transport.abort()


class Proxy:
    """One listener per ``(ClusterIP, port)`` with Ready backends; connections are spliced."""

    def __init__(self) -> None:
        self.table: dict[Address, Route] = {}
        self.servers: dict[Address, asyncio.Server] = {}
        self.turns: dict[Address, itertools.count[int]] = {}

    async def apply(self, table: dict[Address, Route]) -> None:
        self.table = table
        self.turns = {a: turn for a, turn in self.turns.items() if a in table}
        wanted = {address for address, route in table.items() if route.backends}
        for address in set(self.servers) - wanted:
            self.servers.pop(address).close()
            log.info("Stopped listening on %s:%d", *address)
        for address in sorted(wanted - set(self.servers)):
            handler = functools.partial(self._serve, address)
            try:
                self.servers[address] = await asyncio.start_server(
                    handler, address[0], address[1], reuse_address=True
                )
            except OSError as error:
                log.warning("Cannot listen on %s:%d: %s", *address, error)
                continue
            route = table[address]
            log.info("Listening on %s:%d for %s/%s", *address, route.namespace, route.service)

    async def _connect(
        self, address: Address
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        route = self.table.get(address)
        backends = route.backends if route else ()
        start = next(self.turns.setdefault(address, itertools.count()))
        for offset in range(len(backends)):
            backend = backends[(start + offset) % len(backends)]
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(backend.ip, backend.port), CONNECT_SECONDS
                )
            except (OSError, TimeoutError) as error:
                log.info("Backend %s:%d failed: %r", backend.ip, backend.port, error)
        return None

    async def _serve(
        self, address: Address, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        upstream = await self._connect(address)
        if upstream is None:
            writer.transport.abort()
            return
        up_reader, up_writer = upstream
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for stream in (writer, up_writer):
                with contextlib.suppress(OSError, RuntimeError):
                    stream.close()


def api_http(kubeconfig: Path) -> httpx.AsyncClient:
    """An async client for the API server ``kubeconfig`` names, with its token and CA."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    return httpx.AsyncClient(
        base_url=cluster["server"],
        verify=ssl.create_default_context(cafile=cluster["certificate-authority"]),
        headers={"Authorization": f"Bearer {user['token']}"},
        timeout=10.0,
    )


async def run(kubeconfig: Path, host: str, dns_port: int) -> None:
    http = api_http(kubeconfig)
    dirty = asyncio.Event()
    services = Watch(http, "/api/v1/services", dirty.set)
    slices = Watch(http, "/apis/discovery.k8s.io/v1/endpointslices", dirty.set)
    proxy, cluster_dns = Proxy(), ClusterDns()

    async def reconcile() -> None:
        while True:
            await dirty.wait()
            dirty.clear()
            if services.synced and slices.synced:
                await proxy.apply(routes(services.store, slices.store))
                cluster_dns.records = dns_records(services.store, slices.store)

    # the first task to fail (say, DNS cannot bind) ends the process with its error
    await asyncio.gather(
        services.run(), slices.run(), reconcile(), cluster_dns.serve(host, dns_port)
    )


def _answers(host: str, name: str) -> bool:
    import dns.message
    import dns.query

    answer = dns.query.udp(dns.message.make_query(name, "A"), host, port=DNS_PORT, timeout=1)
    return bool(answer.answer)


def start_kube_proxy(kubeconfig: Path, logs: Path, host: str) -> process.Component:
    """Start the proxy (``wait_kube_proxy`` waits for it)."""
    argv = [
        sys.executable,
        "-m",
        "kvscale_cluster.kube_proxy",
        f"--kubeconfig={kubeconfig}",
        f"--host={host}",
    ]
    return process.start("kube-proxy", argv, logs)


def wait_kube_proxy(component: process.Component, host: str) -> None:
    """Wait until its DNS answers for the ``kubernetes`` Service (so both watches have synced)."""

    def ready() -> bool:
        if not process.alive(component.pid):
            raise GiveUp(f"kube-proxy exited:\n{process.tail(component.log)}")
        return _answers(host, "kubernetes.default.svc.cluster.local")

    wait_for(ready, 30, "kube-proxy's DNS answering for kubernetes.default")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvscale_cluster.kube_proxy")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--host", required=True, help="the bridge address (DNS listens there)")
    parser.add_argument("--dns-port", type=int, default=DNS_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(run(args.kubeconfig, args.host, args.dns_port))


if __name__ == "__main__":
    main()
