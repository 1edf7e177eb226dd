"""Cluster DNS for the local cluster, served by the kube-proxy process on the bridge address.

Names under ``cluster.local`` come from the proxy's current records (``service_table``); any
other name is resolved with the host's resolver, as CoreDNS forwards to the node's. Pods find it
through the ``resolv.conf`` the kubelet writes for their network namespace (``netns.py``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import cast

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

from .service_table import DOMAIN

log = logging.getLogger("kvscale.cluster_dns")
TTL = 5
FORWARD_TTL = 30
FAMILIES = {dns.rdatatype.A: socket.AF_INET, dns.rdatatype.AAAA: socket.AF_INET6}


class ClusterDns:
    """Answers queries from ``records`` (replaced whole by the proxy on every change)."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {}

    async def respond(self, wire: bytes) -> bytes | None:
        """The answer to one query in wire format, or None for a packet that is not one."""
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return None
        response = dns.message.make_response(query)
        response.flags |= dns.flags.RA
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return response.to_wire()
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        if name == DOMAIN or name.endswith(f".{DOMAIN}"):
            self._answer_cluster(response, name, question)
        else:
            await self._answer_forwarded(response, name, question)
        return response.to_wire()

    def _answer_cluster(self, response: dns.message.Message, name: str, q: dns.rrset.RRset) -> None:
        response.flags |= dns.flags.AA
        addresses = self.records.get(name)
        if addresses is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif q.rdtype == dns.rdatatype.A and addresses:
            response.answer.append(dns.rrset.from_text_list(q.name, TTL, "IN", "A", addresses))

    async def _answer_forwarded(
        self, response: dns.message.Message, name: str, q: dns.rrset.RRset
    ) -> None:
        family = FAMILIES.get(q.rdtype)
        if family is None:
            response.set_rcode(dns.rcode.NOTIMP)
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, None, family=family, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            response.set_rcode(dns.rcode.NXDOMAIN)
            return
        addresses = sorted({str(info[4][0]) for info in infos})
        kind = dns.rdatatype.to_text(q.rdtype)
        response.answer.append(dns.rrset.from_text_list(q.name, FORWARD_TTL, "IN", kind, addresses))

    async def serve(self, host: str, port: int) -> None:
        """Listen on ``host:port`` over UDP and TCP until cancelled."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(host, port)
        )
        server = await asyncio.start_server(self._serve_tcp, host, port, reuse_address=True)
        log.info("Serving cluster DNS on %s:%d", host, port)
        try:
            await asyncio.Future()
        finally:
            transport.close()
            server.close()

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = struct.unpack("!H", await reader.readexactly(2))
                answer = await self.respond(await reader.readexactly(length))
                if answer is None:
                    break
                writer.write(struct.pack("!H", len(answer)) + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, dns_server: ClusterDns) -> None:
        self.dns = dns_server
        self.transport: asyncio.DatagramTransport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, int]) -> None:
        task = asyncio.ensure_future(self._reply(data, addr))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _reply(self, data: bytes, addr: tuple[str | int, int]) -> None:
        answer = await self.dns.respond(data)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)
