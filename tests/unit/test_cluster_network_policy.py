"""The local cluster's NetworkPolicy translation (kvscale_cluster.network_policy): which pods a
policy isolates, what each lets in, and the iptables-restore input that enforces it."""

from __future__ import annotations

from typing import Any

import pytest

from kvscale.children import engine, network
from kvscale_cluster.network_policy import (
    ANY,
    Allow,
    Peer,
    PodIngress,
    Ports,
    ingress,
    owns_chain,
    restore_input,
    selects,
)

TCP_8000 = Ports("TCP", 8000, 8000)


def pod(
    name: str,
    ip: str | None,
    labels: dict[str, str] | None = None,
    namespace: str = "web",
    ports: list[dict[str, Any]] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    status = {"phase": phase, **({"podIP": ip} if ip else {})}
    container = {"name": "main", "ports": ports or []}
    meta = {"name": name, "namespace": namespace, "labels": labels or {}}
    return {"metadata": meta, "spec": {"containers": [container]}, "status": status}


def policy(
    name: str, selector: dict[str, Any], ingress_rules: list[Any] | None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"podSelector": selector, **spec}
    if ingress_rules is not None:
        body["ingress"] = ingress_rules
    return {"metadata": {"name": name, "namespace": "web"}, "spec": body}


def ns(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


NAMESPACES = [ns("web"), ns("ops", team="ops"), ns("other")]
API = pod("api", "10.244.1.2", {"app": "api", "tier": "back"})
CLIENT = pod("client", "10.244.1.3", {"app": "client"})
OPS = pod("ops-agent", "10.244.1.4", {"app": "agent"}, namespace="ops")
OTHER = pod("stray", "10.244.1.5", {"app": "client"}, namespace="other")
PODS = [API, CLIENT, OPS, OTHER]


def allowed(rules: list[PodIngress], name: str) -> set[tuple[str, Ports | None]]:
    (found,) = [r for r in rules if r.name == name]
    return {(a.peer.cidr, a.ports) for a in found.allows}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {"a": "1"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
            {"a": "2"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
            {"a": "1"},
            False,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
        (
            {"matchLabels": {"b": "2"}, "matchExpressions": [{"key": "a", "operator": "Exists"}]},
            {"b": "2"},
            False,
        ),
    ],
)
def test_label_selectors(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert selects(selector, labels) is expected


def test_pods_no_policy_selects_are_not_isolated() -> None:
    rules = ingress([policy("api", {"matchLabels": {"app": "api"}}, [])], PODS, NAMESPACES)
    assert [(r.name, r.allows) for r in rules] == [("api", ())]  # isolated, nothing let in


def test_an_egress_only_policy_isolates_nothing() -> None:
    only_egress = policy("out", {}, None, policyTypes=["Egress"], egress=[{}])
    assert ingress([only_egress], PODS, NAMESPACES) == []


def test_peers_by_pod_namespace_both_and_ip_block() -> None:
    rules = [
        {"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]},  # this namespace only
        {"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]},
        {
            "from": [
                {
                    "namespaceSelector": {},
                    "podSelector": {"matchLabels": {"app": "client"}},
                }  # every namespace's clients: the other namespace's too
            ],
            "ports": [{"port": 9000}],
        },
        {"from": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}}]},
    ]
    found = ingress([policy("api", {"matchLabels": {"app": "api"}}, rules)], PODS, NAMESPACES)
    assert allowed(found, "api") == {
        ("10.244.1.3/32", None),
        ("10.244.1.4/32", None),
        ("10.244.1.3/32", Ports("TCP", 9000, 9000)),
        ("10.244.1.5/32", Ports("TCP", 9000, 9000)),
        ("192.168.0.0/16", None),
    }
    (api,) = found
    assert Allow(Peer("192.168.0.0/16", ("192.168.1.0/24",)), None) in api.allows


def test_ports_named_numeric_ranges_and_protocols() -> None:
    named = pod(
        "api", "10.244.1.2", {"app": "api"}, ports=[{"name": "http", "containerPort": 8000}]
    )
    ports = [
        {"port": "http"},  # the pod's named container port
        {"port": "metrics"},  # a name the pod lacks: matches nothing
        {"protocol": "UDP", "port": 5000, "endPort": 5010},
        {"protocol": "SCTP"},  # every SCTP port
    ]
    found = ingress([policy("api", {}, [{"ports": ports}])], [named], NAMESPACES)
    assert allowed(found, "api") == {
        (ANY, TCP_8000),
        (ANY, Ports("UDP", 5000, 5010)),
        (ANY, Ports("SCTP")),
    }


def test_several_policies_union_and_an_empty_rule_allows_everything() -> None:
    first = policy("a", {"matchLabels": {"app": "api"}}, [{"ports": [{"port": 8000}]}])
    second = policy("b", {"matchLabels": {"tier": "back"}}, [{}])
    found = ingress([first, second], PODS, NAMESPACES)
    assert allowed(found, "api") == {(ANY, TCP_8000), (ANY, None)}


def test_pods_without_addresses_are_neither_targets_nor_sources() -> None:
    pods = [
        API,
        pod("pending", None, {"app": "client"}),
        pod("done", "10.244.1.9", {"app": "client"}, phase="Succeeded"),
        pod("new-api", None, {"app": "api"}),
        {**pod("host", "10.0.0.1", {"app": "client"}), "spec": {"hostNetwork": True}},
    ]
    rules = [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}]
    found = ingress([policy("api", {"matchLabels": {"app": "api"}}, rules)], pods, NAMESPACES)
    assert [(r.name, r.allows) for r in found] == [("api", ())]


def test_the_engine_policy_lets_the_operator_everywhere_and_routers_to_the_api_port() -> None:
    owner = engine.Owner("chat", "web", "uid")
    rendered = network.engine_network_policy(owner, "kvscale-system")
    namespaces = [*NAMESPACES, ns("kvscale-system"), ns("prom", **{network.SCRAPER_LABEL: "true"})]
    pods = [
        pod("chat-engine-1", "10.244.1.10", engine.selector_labels("chat")),
        pod("chat-router-1", "10.244.1.11", engine.selector_labels("chat", "router")),
        pod("op", "10.244.1.12", network.OPERATOR_LABELS, namespace="kvscale-system"),
        pod("prometheus", "10.244.1.13", {}, namespace="prom"),
        pod("stray", "10.244.1.14", {}),
    ]
    found = ingress([rendered], pods, namespaces)
    assert allowed(found, "chat-engine-1") == {
        ("10.244.1.12/32", None),
        ("10.244.1.11/32", TCP_8000),
        ("10.244.1.13/32", TCP_8000),
    }


def test_restore_input_rewrites_the_slots_chains_in_one_transaction() -> None:
    isolated = [
        PodIngress(
            "web",
            "api",
            "10.244.7.2",
            (
                Allow(Peer("10.244.7.3/32"), TCP_8000),
                Allow(Peer("10.0.0.0/8", ("10.1.0.0/16",)), None),
                Allow(Peer(ANY), Ports("UDP")),
            ),
        )
    ]
    text = restore_input(7, isolated, existing=["KVS-NP-7", "KVS-NP-7-9", "KVS-NP-77"])
    assert text.splitlines() == [
        "*filter",
        ":KVS-NP-7 - [0:0]",
        ":KVS-NP-7-2 - [0:0]",
        ":KVS-NP-7-2-1 - [0:0]",
        ":KVS-NP-7-9 - [0:0]",
        "-A KVS-NP-7 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-A KVS-NP-7 -d 10.244.7.2/32 -m comment --comment web/api -j KVS-NP-7-2",
        "-A KVS-NP-7-2 -s 10.244.7.3/32 -p tcp -m tcp --dport 8000 -j ACCEPT",
        "-A KVS-NP-7-2-1 -s 10.1.0.0/16 -j RETURN",
        "-A KVS-NP-7-2-1 -j ACCEPT",
        "-A KVS-NP-7-2 -s 10.0.0.0/8 -j KVS-NP-7-2-1",
        "-A KVS-NP-7-2 -p udp -j ACCEPT",
        "-A KVS-NP-7-2 -j DROP",
        "-A KVS-NP-7 -j ACCEPT",
        "-X KVS-NP-7-9",  # a pod no longer isolated; slot 77's chain is not slot 7's
        "COMMIT",
    ]


def test_chain_ownership_is_by_slot() -> None:
    assert owns_chain(1, "KVS-NP-1") and owns_chain(1, "KVS-NP-1-5")
    assert not owns_chain(1, "KVS-NP-15") and not owns_chain(1, "FORWARD")
