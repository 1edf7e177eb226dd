"""The engine pods' NetworkPolicy: the admin port (drain) from the operator only, the OpenAI port
from the endpoint's routers and labelled scraper namespaces too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvscale.children import engine, network
from kvscale.children.engine_args import ADMIN_PORT, ENGINE_PORT

OWNER = engine.Owner("chat", "team-a", "uid-1")


def ports_open_to(policy: dict[str, Any], peer: dict[str, Any]) -> set[int] | None:
    """The ports `peer` may reach (None: every port), as a policy's ingress rules read."""
    opened: set[int] = set()
    for rule in policy["spec"]["ingress"]:
        if peer in rule["from"]:
            if "ports" not in rule:
                return None
            opened |= {p["port"] for p in rule["ports"]}
    return opened


def test_only_the_operator_reaches_the_admin_port() -> None:
    policy = network.engine_network_policy(OWNER, "ops")
    assert policy["metadata"]["name"] == "chat-engine"
    assert policy["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert policy["spec"]["podSelector"]["matchLabels"] == engine.selector_labels("chat")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kvscale-operator"}},
    }
    routers = {"podSelector": {"matchLabels": engine.selector_labels("chat", "router")}}
    scrapers = {"namespaceSelector": {"matchLabels": {"kvscale.io/metrics-scraper": "true"}}}
    assert ports_open_to(policy, operator) is None  # the admin port included
    assert ports_open_to(policy, routers) == {ENGINE_PORT}
    assert ports_open_to(policy, scrapers) == {ENGINE_PORT}
    for rule in policy["spec"]["ingress"]:
        assert ADMIN_PORT not in {p["port"] for p in rule.get("ports", [])}
        assert all(peer in (operator, routers, scrapers) for peer in rule["from"])


def test_operator_pod_labels_match_the_manifests() -> None:
    root = Path(__file__).resolve().parents[3]
    deployment = yaml.safe_load((root / "manifests" / "base" / "operator.yaml").read_text())
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert network.OPERATOR_LABELS.items() <= labels.items()


@pytest.mark.parametrize(("env", "expected"), [("ops", "ops"), ("", "kvscale-system")])
def test_operator_namespace(monkeypatch: pytest.MonkeyPatch, env: str, expected: str) -> None:
    monkeypatch.setenv(network.NAMESPACE_ENV, env)
    monkeypatch.setattr(network, "POD_NAMESPACE_FILE", Path("/nonexistent/namespace"))
    network.operator_namespace.cache_clear()
    try:
        assert network.operator_namespace() == expected
    finally:
        network.operator_namespace.cache_clear()
