"""The LLMEndpoint API as Kubernetes tools read it from the real API server: `kubectl explain`,
the scale subresource, the client address, list-maps and server-side apply, name limits."""

from __future__ import annotations

from typing import Any

from kvscale_cluster.fixtures import kubectl, wait_for


def explain(cluster: Any, field: str) -> str:
    """`kubectl explain` once discovery serves the CRD's OpenAPI v3 document."""
    done: list[str] = []

    def answered() -> bool:
        out = kubectl(cluster, "explain", field, check=False)
        done[:] = [out.stdout]
        return out.returncode == 0

    wait_for(answered, timeout=30, what=f"kubectl explain {field}")
    return done[0]


def test_kubectl_explain_describes_fields_with_units_and_defaults(cluster: Any, crd: None) -> None:
    out = explain(cluster, "llme.spec.scaling")
    assert "Seconds between the capacity controller's decisions" in out, out
    assert "Default: 60." in out, out
    field = explain(cluster, "llme.spec.model.source.hostPath")
    assert "checkpoint directory on the node" in field, field
