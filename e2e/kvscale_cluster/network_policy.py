"""What NetworkPolicies mean for the pod network: pure functions from the API objects to the
ingress each isolated pod allows, and from that to the ``iptables-restore`` input that enforces it.

Ingress only, IPv4 only, as the Kubernetes spec reads: a pod selected by any policy whose
``policyTypes`` include Ingress (``Ingress`` is implied when the field is absent) is isolated,
and a connection to it is allowed when any ingress rule of any such policy allows it: its
``from`` peers (a ``podSelector`` in the policy's namespace, a ``namespaceSelector``, both
combined, or an ``ipBlock`` with ``except``; no ``from`` allows every source) and its ``ports``
(protocol, numeric or named container port, ``endPort``; no ``ports`` allows every port).
Egress rules are not enforced. Pods without an IP, finished pods and host-network pods are
neither isolated nor sources. Traffic from the node is not judged at all: it never crosses the
bridge's FORWARD path (see ``policy_controller.py``).

The rules live in chains of the cluster's own: ``KVS-NP-<slot>`` (jumped to for bridged traffic
on the cluster's bridge only) lets established and related packets through, sends each isolated
pod's new connections to its chain ``KVS-NP-<slot>-<last octet>``, and accepts the rest (pods no
policy isolates); a pod's chain accepts what its rules allow and drops everything else (a
connection times out, as with Calico and Cilium). An ``ipBlock`` with ``except`` gets a chain
of its own that returns for the excepted ranges.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from .kube_api import Obj

ANY = "0.0.0.0/0"
FINISHED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Peer:
    """Sources by address: ``cidr`` less the ``excepts`` ranges."""

    cidr: str
    excepts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ports:
    """A protocol and a port range (``first`` None: every port of the protocol)."""

    protocol: str
    first: int | None = None
    last: int | None = None


@dataclass(frozen=True)
class Allow:
    """One allowed (source, ports) pair; ``ports`` None: every port and protocol."""

    peer: Peer
    ports: Ports | None


@dataclass(frozen=True)
class PodIngress:
    """An isolated pod: its address and everything its policies let in (possibly nothing)."""

    namespace: str
    name: str
    ip: str
    allows: tuple[Allow, ...]


# -- selectors


def _expression(labels: Mapping[str, str], expr: Obj) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # an operator the API server would have refused


def selects(selector: Obj | None, labels: Mapping[str, str] | None) -> bool:
    """A LabelSelector against ``labels``: every matchLabels pair and every expression holds
    (the empty selector selects everything)."""
    labels = labels or {}
    selector = selector or {}
    wanted = selector.get("matchLabels") or {}
    if any(labels.get(key) != value for key, value in wanted.items()):
        return False
    return all(_expression(labels, e) for e in selector.get("matchExpressions") or [])


# -- pods and namespaces


def _labels(obj: Obj) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def pod_ip(pod: Obj) -> str | None:
    """The pod's IPv4 address when it takes part in pod networking: running or pending with an
    address, not on the host's network."""
    status = pod.get("status") or {}
    if pod.get("spec", {}).get("hostNetwork") or status.get("phase") in FINISHED:
        return None
    address = status.get("podIP")
    if not address or ipaddress.ip_address(address).version != 4:
        return None
    return str(address)


def _namespace_labels(namespaces: Iterable[Obj]) -> dict[str, dict[str, str]]:
    """Namespace name -> labels, with ``kubernetes.io/metadata.name`` as the API server sets."""
    found: dict[str, dict[str, str]] = {}
    for ns in namespaces:
        name = ns["metadata"]["name"]
        found[name] = {**_labels(ns), "kubernetes.io/metadata.name": name}
    return found


def _sources(
    peer: Obj, policy_ns: str, pods: Sequence[Obj], ns_labels: Mapping[str, dict[str, str]]
) -> list[Peer]:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        if ipaddress.ip_network(block["cidr"], strict=False).version != 4:
            return []
        return [Peer(block["cidr"], tuple(block.get("except") or ()))]
    found: list[Peer] = []
    for pod in pods:
        ip, ns = pod_ip(pod), pod["metadata"]["namespace"]
        if ip is None:
            continue
        if "namespaceSelector" in peer:
            if ns not in ns_labels or not selects(peer["namespaceSelector"], ns_labels[ns]):
                continue
        elif ns != policy_ns:
            continue
        if "podSelector" in peer and not selects(peer["podSelector"], _labels(pod)):
            continue
        found.append(Peer(f"{ip}/32"))
    return found


def _named_port(pod: Obj, name: str, protocol: str) -> int | None:
    for container in pod.get("spec", {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("protocol", "TCP") == protocol:
                return int(port["containerPort"])
    return None


def _ports(entry: Obj, target: Obj) -> Ports | None:
    """The port range ``entry`` names on pod ``target``; None: a named port it does not have."""
    protocol = entry.get("protocol", "TCP")
    port = entry.get("port")
    if port is None:
        return Ports(protocol)
    if isinstance(port, str) and not port.isdigit():
        number = _named_port(target, port, protocol)
        return None if number is None else Ports(protocol, number, number)
    return Ports(protocol, int(port), int(entry.get("endPort") or port))


def _rule_allows(
    rule: Obj,
    policy_ns: str,
    target: Obj,
    pods: Sequence[Obj],
    ns_labels: Mapping[str, dict[str, str]],
) -> Iterator[Allow]:
    peers = rule.get("from")
    sources = (
        [s for peer in peers for s in _sources(peer, policy_ns, pods, ns_labels)]
        if peers
        else [Peer(ANY)]
    )
    entries = rule.get("ports")
    if not entries:
        yield from (Allow(source, None) for source in sources)
        return
    ranges = [r for r in (_ports(e, target) for e in entries) if r is not None]
    for source in sources:
        yield from (Allow(source, r) for r in ranges)


def isolates_ingress(policy: Obj) -> bool:
    types = policy.get("spec", {}).get("policyTypes")
    return types is None or "Ingress" in types


def ingress(
    policies: Iterable[Obj], pods: Iterable[Obj], namespaces: Iterable[Obj]
) -> list[PodIngress]:
    """Every isolated pod (by IP) with the union of what its policies let in."""
    pods, ns_labels = list(pods), _namespace_labels(namespaces)
    policies = [p for p in policies if isolates_ingress(p)]
    isolated: list[PodIngress] = []
    for target in pods:
        ip, ns = pod_ip(target), target["metadata"]["namespace"]
        if ip is None:
            continue
        selecting = [
            p
            for p in policies
            if p["metadata"]["namespace"] == ns
            and selects(p["spec"].get("podSelector"), _labels(target))
        ]
        if not selecting:
            continue
        allows = dict.fromkeys(
            allow
            for policy in selecting
            for rule in policy["spec"].get("ingress") or []
            for allow in _rule_allows(rule, ns, target, pods, ns_labels)
        )
        isolated.append(PodIngress(ns, target["metadata"]["name"], ip, tuple(allows)))
    return sorted(isolated, key=lambda p: ipaddress.ip_address(p.ip))


# -- iptables


def main_chain(slot: int) -> str:
    return f"KVS-NP-{slot}"


def owns_chain(slot: int, chain: str) -> bool:
    """Whether ``chain`` is one of slot ``slot``'s (``KVS-NP-1-5`` is slot 1's, not slot 15's)."""
    return chain == main_chain(slot) or chain.startswith(f"{main_chain(slot)}-")


def _match(ports: Ports | None) -> list[str]:
    if ports is None:
        return []
    match = ["-p", ports.protocol.lower()]
    if ports.first is not None:
        span = str(ports.first) if ports.last == ports.first else f"{ports.first}:{ports.last}"
        match += ["-m", ports.protocol.lower(), "--dport", span]
    return match


def restore_input(slot: int, isolated: Sequence[PodIngress], existing: Iterable[str] = ()) -> str:
    """The ``iptables-restore --noflush`` input that rewrites slot ``slot``'s chains for
    ``isolated`` in one transaction: each chain is declared (so created or flushed), filled, and
    ``existing`` chains of the slot that are no longer needed are deleted."""
    top = main_chain(slot)
    chains = [top]
    rules = [f"-A {top} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"]
    for pod in isolated:
        chain = f"{top}-{pod.ip.rsplit('.', 1)[1]}"
        chains.append(chain)
        rules.append(
            f"-A {top} -d {pod.ip}/32 -m comment --comment {pod.namespace}/{pod.name} -j {chain}"
        )
        for index, allow in enumerate(pod.allows):
            target = "ACCEPT"
            if allow.peer.excepts:
                target = f"{chain}-{index}"
                chains.append(target)
                rules += [f"-A {target} -s {cidr} -j RETURN" for cidr in allow.peer.excepts]
                rules.append(f"-A {target} -j ACCEPT")
            source = [] if allow.peer.cidr == ANY else ["-s", allow.peer.cidr]
            rules.append(" ".join(["-A", chain, *source, *_match(allow.ports), "-j", target]))
        rules.append(f"-A {chain} -j DROP")
    rules.append(f"-A {top} -j ACCEPT")
    stale = sorted(c for c in set(existing) - set(chains) if owns_chain(slot, c))
    lines = [
        "*filter",
        *(f":{c} - [0:0]" for c in [*chains, *stale]),
        *rules,
        *(f"-X {c}" for c in stale),
        "COMMIT",
        "",
    ]
    return "\n".join(lines)
