"""RBAC against the real API server: tenants with the built-in roles manage endpoints through
the aggregated ClusterRoles, and the operator cannot grant what it does not hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from endpoint_helpers import ROOT

from kvscale_cluster.fixtures import kubectl, wait_for
from kvscale_cluster.specs import endpoint_body

AGGREGATED = ("kvscale-llmendpoints-view", "kvscale-llmendpoints-edit")
OPERATOR = "system:serviceaccount:kvscale-system:kvscale-operator"


def rendered_rbac(cluster: Any, names: tuple[str, ...]) -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(kubectl(cluster, "kustomize", str(ROOT / "manifests")).stdout)
    return [d for d in docs if d["metadata"]["name"] in names and d["kind"] != "Deployment"]


@pytest.fixture
def aggregated(cluster: Any, crd: None) -> Iterator[None]:
    docs = rendered_rbac(cluster, AGGREGATED)
    assert {d["metadata"]["name"] for d in docs} == set(AGGREGATED)
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    try:
        yield
    finally:
        for name in AGGREGATED:
            kubectl(cluster, "delete", "clusterrole", name, "--ignore-not-found")


def bind(cluster: Any, namespace: str, user: str, role: str) -> None:
    kubectl(cluster, "-n", namespace, "create", "rolebinding", f"{user}-{role}",
            f"--clusterrole={role}", f"--user={user}")  # fmt: skip


def can(cluster: Any, namespace: str, user: str, verb: str, resource: str) -> bool:
    done = kubectl(cluster, "-n", namespace, "auth", "can-i", verb, resource, f"--as={user}",
                   check=False)  # fmt: skip
    return done.stdout.strip() == "yes"


def test_built_in_edit_and_view_roles_cover_endpoints(
    cluster: Any, namespace: str, aggregated: None
) -> None:
    bind(cluster, namespace, "alice", "edit")
    bind(cluster, namespace, "bob", "view")
    wait_for(
        lambda: can(cluster, namespace, "alice", "create", "llmendpoints.kvscale.io"),
        timeout=30,
        what="the edit role aggregated",
    )
    manifest = json.dumps(endpoint_body("chat", namespace))
    kubectl(cluster, "create", "--as=alice", "-f", "-", stdin=manifest)
    kubectl(cluster, "-n", namespace, "scale", "--as=alice", "llme/chat", "--replicas=2")
    wait_for(
        lambda: can(cluster, namespace, "bob", "get", "llmendpoints.kvscale.io"),
        timeout=30,
        what="the view role aggregated",
    )
    got = kubectl(cluster, "-n", namespace, "get", "--as=bob", "llme", "chat", "-o", "json")
    assert json.loads(got.stdout)["spec"]["scaling"]["minReplicas"] == 2
    refused = kubectl(cluster, "create", "--as=bob", "-f", "-", stdin=manifest, check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    assert not can(cluster, namespace, "bob", "delete", "llmendpoints.kvscale.io")
    assert not can(cluster, namespace, "bob", "update", "llmendpoints.kvscale.io/scale")


def test_operator_applies_rbac_but_cannot_delete_or_escalate(
    cluster: Any, namespace: str, crd: None
) -> None:
    docs = rendered_rbac(cluster, ("kvscale-operator",))
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    namespace_doc = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "kvscale-system"},
    }
    docs = [namespace_doc, *(d for d in docs if d["kind"] in kinds)]
    kubectl(cluster, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
    wait_for(lambda: can(cluster, namespace, OPERATOR, "create", "rolebindings"), 30, "RBAC")
    for verb in ("create", "patch"):
        assert can(cluster, namespace, OPERATOR, verb, "roles")
    for verb in ("delete", "update", "list", "watch", "get"):
        assert not can(cluster, namespace, OPERATOR, verb, "rolebindings"), verb
        assert not can(cluster, namespace, OPERATOR, verb, "roles"), verb
    # no bind or escalate: a binding to a role with more than the operator holds is refused
    escalation = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "grab", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "admin",
        },
        "subjects": [{"kind": "User", "name": "mallory"}],
    }
    refused = kubectl(cluster, "create", f"--as={OPERATOR}", "-f", "-",
                      stdin=json.dumps(escalation), check=False)  # fmt: skip
    assert "attempting to grant RBAC permissions not currently held" in refused.stderr, refused
