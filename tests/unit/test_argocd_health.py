"""The Argo CD health check (manifests/argocd/health.lua), run in Lua against status fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import LuaRuntime

ARGOCD = Path(__file__).resolve().parents[2] / "manifests" / "argocd"
SCRIPT = (ARGOCD / "health.lua").read_text()
KEY = "resource.customizations.health.kvscale.io_LLMEndpoint"


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def endpoint(generation: int = 3, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kvscale.io/v1alpha1",
        "kind": "LLMEndpoint",
        "metadata": {"name": "chat", "namespace": "llm", "generation": generation},
        "spec": {"model": {"name": "tiny", "source": {"dummy": {}}}},
    }
    if status:
        body["status"] = status
    return body


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """What Argo CD shows: the script runs with the resource as the global `obj`."""
    lua = LuaRuntime()
    lua.globals().obj = lua.table_from(obj, recursive=True)
    hs = lua.execute(SCRIPT)
    return str(hs["status"]), str(hs["message"])


READY = cond("Ready", "True", "Ready", "2 of 2 replicas ready")
NOT_RECONCILING = cond("Reconciling", "False", "Stable")
NOT_STALLED = cond("Stalled", "False", "Stable")

CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("healthy", endpoint(observedGeneration=3, conditions=[READY, NOT_RECONCILING, NOT_STALLED]),
     "Healthy", "Ready: 2 of 2 replicas ready"),
    ("no-status-yet", endpoint(), "Progressing", "report status"),
    ("spec-not-yet-observed", endpoint(generation=4, observedGeneration=3, conditions=[READY]),
     "Progressing", "observe generation 4"),
    ("never-observed", endpoint(conditions=[READY]), "Progressing", "observe generation 3"),
    ("rolling-out", endpoint(observedGeneration=3, conditions=[
        cond("Ready", "False", "Reconciling"),
        cond("Reconciling", "True", "ScalingUp", "1 of 3 replicas ready"), NOT_STALLED]),
     "Progressing", "ScalingUp: 1 of 3 replicas ready"),
    ("invalid-spec", endpoint(observedGeneration=3, conditions=[
        cond("Ready", "False", "InvalidSpec"), NOT_RECONCILING,
        cond("Stalled", "True", "InvalidSpec", "spec.engine.image is not an image")]),
     "Degraded", "InvalidSpec: spec.engine.image is not an image"),
    ("stuck-while-converging", endpoint(observedGeneration=3, conditions=[
        cond("Reconciling", "True", "ScalingUp"),
        cond("Stalled", "True", "ProgressDeadlineExceeded", "no replica ready in 600 s")]),
     "Degraded", "ProgressDeadlineExceeded: no replica ready in 600 s"),
    ("degraded", endpoint(observedGeneration=3, conditions=[
        READY, cond("Degraded", "True", "EngineCrashLooping", "replica chat-1 restarts")]),
     "Degraded", "EngineCrashLooping: replica chat-1 restarts"),
    ("not-degraded", endpoint(observedGeneration=3, conditions=[
        READY, cond("Degraded", "False", "AsExpected")]), "Healthy", "Ready"),
    ("not-ready-at-rest", endpoint(observedGeneration=3, conditions=[
        cond("Ready", "False", "NoReplicas", "scaled to zero"), NOT_RECONCILING, NOT_STALLED]),
     "Progressing", "NoReplicas: scaled to zero"),
    ("no-conditions", endpoint(observedGeneration=3), "Progressing", "Waiting for the Ready"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "obj", "status", "message"), CASES, ids=[c[0] for c in CASES])
def test_health_of_each_state(case: str, obj: dict[str, Any], status: str, message: str) -> None:
    got_status, got_message = health(obj)
    assert got_status == status
    assert message in got_message


def test_the_argocd_cm_snippet_carries_the_same_script() -> None:
    patch = yaml.safe_load((ARGOCD / "argocd-cm-patch.yaml").read_text())
    assert patch["kind"] == "ConfigMap" and patch["metadata"]["name"] == "argocd-cm"
    assert patch["data"] == {KEY: SCRIPT}
