"""The operator's watches of children are filtered by a label selector on the API server.

Seen from the server's side, in its audit log: every list and watch the operator (Kopf, user
agent `kopf/…`) sends for Deployments, Services, PodDisruptionBudgets and Pods carries a
`labelSelector`, and with 30 foreign Deployments in the cluster the Deployments the server hands
the operator's listing hold none of them (so no event of theirs is ever streamed to it either:
the watch that follows carries the same selector). The same log shows an unfiltered listing of
those Deployments in full, so the check would catch a selector that went missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from endpoint_helpers import endpoint, wait_available

from kvscale.kube import Kube
from kvscale_cluster.control_plane import audit_log
from kvscale_cluster.fixtures import Cluster, kubectl, run_operator, wait_for

FOREIGN = 30
WATCHED = {
    ("apps", "deployments"): "app.kubernetes.io/managed-by=kvscale",
    ("", "services"): "app.kubernetes.io/managed-by=kvscale",
    ("policy", "poddisruptionbudgets"): "app.kubernetes.io/managed-by=kvscale",
    ("", "pods"): "kvscale.io/endpoint",
}


def foreign_deployments(namespace: str) -> dict[str, Any]:
    """Deployments no kvscale endpoint owns, at zero replicas (no pods needed)."""
    items = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"foreign-{i}", "namespace": namespace, "labels": {"app": "x"}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": f"foreign-{i}"}},
                "template": {
                    "metadata": {"labels": {"app": f"foreign-{i}"}},
                    "spec": {"containers": [{"name": "c", "image": "kvscale/testserver"}]},
                },
            },
        }
        for i in range(FOREIGN)
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def audited(log: Path) -> list[dict[str, Any]]:
    """The audit events logged so far (the log rotates at 20 MB: read the backup too)."""
    found: list[dict[str, Any]] = []
    for path in sorted(log.parent.glob("audit*.log")):
        for line in path.read_text().splitlines():
            if line.strip():
                found.append(json.loads(line))
    return found


def selector(event: dict[str, Any]) -> str | None:
    values = parse_qs(urlsplit(event["requestURI"]).query).get("labelSelector")
    return str(values[0]) if values else None


def resource(event: dict[str, Any]) -> tuple[str, str]:
    ref = event.get("objectRef") or {}
    return ref.get("apiGroup", ""), ref.get("resource", "")


def listed_names(event: dict[str, Any]) -> set[str]:
    return {i["metadata"]["name"] for i in (event.get("responseObject") or {}).get("items", [])}


def test_operator_lists_and_watches_only_its_children(
    cluster: Cluster, api: Kube, namespace: str, crd: None
) -> None:
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(foreign_deployments(namespace)))
    foreign = {f"foreign-{i}" for i in range(FOREIGN)}
    log = audit_log(cluster.directory)
    since = len(audited(log))
    api.create(endpoint(namespace))
    with run_operator(cluster) as runner:
        wait_available(api, namespace, ready=1)

        def kopf_requests() -> list[dict[str, Any]] | None:
            events = [
                e
                for e in audited(log)[since:]
                if e.get("userAgent", "").startswith("kopf/") and resource(e) in WATCHED
            ]
            seen = {(resource(e), e["verb"]) for e in events}
            wanted = {(r, verb) for r in WATCHED for verb in ("list", "watch")}
            return events if wanted <= seen else None

        requests = wait_for(kopf_requests, timeout=60, what="Kopf's lists and watches, audited")
        # an unfiltered listing of the same namespace, as a control for the check below
        kubectl(cluster, "-n", namespace, "get", "deployments", "-o", "name")
    assert runner.exception is None, runner.output

    for event in requests:
        wanted = WATCHED[resource(event)]
        assert selector(event) == wanted, (
            f"{event['verb']} {event['requestURI']} by {event['userAgent']} is not filtered"
        )
    lists = [e for e in requests if e["verb"] == "list" and resource(e) == ("apps", "deployments")]
    assert lists and all(e.get("responseObject") for e in lists), "listing not recorded"
    for event in lists:
        assert not listed_names(event) & foreign, f"{event['requestURI']} returned foreign ones"

    control = [
        e
        for e in audited(log)[since:]
        if e.get("userAgent", "").startswith("kubectl/")
        and e["verb"] == "list"
        and resource(e) == ("apps", "deployments")
        and (e.get("objectRef") or {}).get("namespace") == namespace
    ]
    assert control and foreign <= listed_names(control[-1]), "the audit log misses listings"
