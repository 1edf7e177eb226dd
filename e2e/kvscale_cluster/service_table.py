"""What Services and EndpointSlices mean for routing: pure functions from the API objects to the
proxy's table (ClusterIP:port → Ready backends) and the DNS records, so the proxy and the DNS
server only apply them."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .kube_api import Obj

DOMAIN = "cluster.local"
Key = tuple[str, str]  # namespace, name
Address = tuple[str, int]  # ClusterIP, port


@dataclass(frozen=True)
class Backend:
    ip: str
    port: int


@dataclass(frozen=True)
class Route:
    """Where connections to one Service port go; ``backends`` are the Ready endpoints."""

    namespace: str
    service: str
    port_name: str
    backends: tuple[Backend, ...]


def object_key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta["namespace"], meta["name"]


def ready_addresses(endpoint_slice: Obj) -> Iterator[str]:
    """The first address of each Ready endpoint (``ready`` unset counts as Ready, as the
    EndpointSlice API says; terminating endpoints are not Ready)."""
    for endpoint in endpoint_slice.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        addresses = endpoint.get("addresses") or []
        if addresses:
            yield addresses[0]


def _slices_by_service(slices: Mapping[Key, Obj]) -> dict[Key, list[Obj]]:
    grouped: dict[Key, list[Obj]] = {}
    for (namespace, _), endpoint_slice in slices.items():
        owner = (endpoint_slice["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
        if owner and endpoint_slice.get("addressType") == "IPv4":
            grouped.setdefault((namespace, owner), []).append(endpoint_slice)
    return grouped


def _cluster_ip(service: Obj) -> str | None:
    spec = service.get("spec") or {}
    ip = spec.get("clusterIP")
    if not ip or ip == "None" or spec.get("type") == "ExternalName":
        return None
    return str(ip)


def _backends(slices: list[Obj], port_name: str) -> tuple[Backend, ...]:
    found = {
        Backend(address, int(port["port"]))
        for endpoint_slice in slices
        for port in endpoint_slice.get("ports") or []
        if (port.get("name") or "") == port_name
        and port.get("protocol", "TCP") == "TCP"
        and port.get("port")
        for address in ready_addresses(endpoint_slice)
    }
    return tuple(sorted(found, key=lambda b: (ipaddress.ip_address(b.ip), b.port)))


def routes(services: Mapping[Key, Obj], slices: Mapping[Key, Obj]) -> dict[Address, Route]:
    """The proxy table: every TCP port of every Service with a ClusterIP, with its backends."""
    grouped = _slices_by_service(slices)
    table: dict[Address, Route] = {}
    for key, service in services.items():
        ip = _cluster_ip(service)
        if ip is None:
            continue
        for port in service["spec"].get("ports") or []:
            if port.get("protocol", "TCP") != "TCP":
                continue
            name = port.get("name") or ""
            backends = _backends(grouped.get(key, []), name)
            table[(ip, int(port["port"]))] = Route(key[0], key[1], name, backends)
    return table


def dns_records(services: Mapping[Key, Obj], slices: Mapping[Key, Obj]) -> dict[str, list[str]]:
    """``<service>.<namespace>.svc.cluster.local`` → its ClusterIP, or for a headless Service the
    addresses of its Ready endpoints (an empty list: the name exists but has no address now)."""
    grouped = _slices_by_service(slices)
    records: dict[str, list[str]] = {}
    for (namespace, name), service in services.items():
        if (service.get("spec") or {}).get("type") == "ExternalName":
            continue
        ip = _cluster_ip(service)
        if ip is not None:
            addresses = [ip]
        else:
            found = {a for s in grouped.get((namespace, name), []) for a in ready_addresses(s)}
            addresses = sorted(found, key=ipaddress.ip_address)
        records[f"{name}.{namespace}.svc.{DOMAIN}"] = addresses
    return records


def service_env(services: list[Obj]) -> dict[str, str]:
    """The variables the kubelet gives a container for the Services of its namespace that have a
    ClusterIP (``enableServiceLinks``): ``<NAME>_SERVICE_HOST``, ``<NAME>_SERVICE_PORT[_<PORT>]``
    and the Docker-link style ``<NAME>_PORT_<port>_TCP*``."""
    env: dict[str, str] = {}
    for service in services:
        ip = _cluster_ip(service)
        ports = service["spec"].get("ports") or []
        if ip is None or not ports:
            continue
        prefix = service["metadata"]["name"].upper().replace("-", "_")
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            number, protocol = port["port"], port.get("protocol", "TCP")
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
            link = f"{prefix}_PORT_{number}_{protocol}"
            env[link] = f"{protocol.lower()}://{ip}:{number}"
            env[f"{link}_PROTO"] = protocol.lower()
            env[f"{link}_PORT"] = str(number)
            env[f"{link}_ADDR"] = ip
        first = ports[0]
        env[f"{prefix}_PORT"] = f"{first.get('protocol', 'TCP').lower()}://{ip}:{first['port']}"
    return env
