"""The process kubelet runs pods as a kubelet does: init containers first, liveness restarts,
preStop before SIGTERM, ``kubectl logs`` and Events."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kubernetes import client
from manifests import PORT, pod

from kvscale_cluster.fixtures import Cluster, kubectl, wait_for

SERVE = ["--port", str(PORT)]


def _pod(core: client.CoreV1Api, namespace: str, name: str) -> Any:
    return core.read_namespaced_pod(name, namespace)


def _ready(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    conditions = _pod(core, namespace, name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def test_init_containers_complete_before_the_main_container_starts(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    manifest = pod("inited", "kvscale/testserver", args=SERVE)
    manifest["spec"]["initContainers"] = [
        {"name": "setup", "image": "kvscale/testserver", "args": ["--exit-code", "0"]}
    ]
    core.create_namespaced_pod(namespace, manifest)
    wait_for(lambda: _ready(core, namespace, "inited"), 60, "inited Ready")
    status = _pod(core, namespace, "inited").status
    init = status.init_container_statuses[0].state.terminated
    assert init.exit_code == 0 and init.reason == "Completed"
    main = status.container_statuses[0].state.running
    assert main.started_at >= init.finished_at
    assert {c.type: c.status for c in status.conditions}["Initialized"] == "True"


def test_failing_liveness_probe_restarts_the_container(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    manifest = pod("sick", "kvscale/testserver", args=SERVE, terminationGracePeriodSeconds=2)
    manifest["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"path": "/no-such-page", "port": PORT},
        "initialDelaySeconds": 1,
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    core.create_namespaced_pod(namespace, manifest)

    def restarted() -> bool:
        statuses = _pod(core, namespace, "sick").status.container_statuses or []
        return bool(statuses) and statuses[0].restart_count >= 1

    wait_for(restarted, 60, "sick restarted by its liveness probe")
    events = core.list_namespaced_event(
        namespace, field_selector="involvedObject.name=sick,reason=Unhealthy"
    ).items
    assert events and "Liveness probe failed" in events[0].message


def test_prestop_hook_runs_before_sigterm(
    kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube)
    hook_marker = tmp_path / "prestop"
    manifest = pod(
        "hooked",
        "kvscale/testserver",
        args=SERVE,
        env=[
            {"name": "POD_NAME", "value": "hooked"},
            {"name": "TERM_MARKER_DIR", "value": str(tmp_path)},
        ],
        terminationGracePeriodSeconds=10,
    )
    write = f"import pathlib; pathlib.Path({str(hook_marker)!r}).write_text('ran')"
    manifest["spec"]["containers"][0]["lifecycle"] = {
        "preStop": {"exec": {"command": [sys.executable, "-c", write]}}
    }
    core.create_namespaced_pod(namespace, manifest)
    wait_for(lambda: _ready(core, namespace, "hooked"), 60, "hooked Ready")
    core.delete_namespaced_pod("hooked", namespace)

    def gone() -> bool:
        return not core.list_namespaced_pod(namespace, field_selector="metadata.name=hooked").items

    wait_for(gone, 60, "hooked deleted")
    term_marker = tmp_path / "hooked"
    assert hook_marker.read_text() == "ran"
    assert term_marker.read_text() == "15\n"
    assert hook_marker.stat().st_mtime_ns <= term_marker.stat().st_mtime_ns


def test_kubectl_logs_and_events_work(
    cluster: Cluster, kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, pod("chatty", "kvscale/testserver", args=SERVE))
    wait_for(lambda: _ready(core, namespace, "chatty"), 60, "chatty Ready")
    logs = kubectl(cluster, "logs", "-n", namespace, "chatty").stdout
    assert f"Serving on 0.0.0.0:{PORT}" in logs
    events = kubectl(cluster, "get", "events", "-n", namespace, "-o", "name").stdout
    reasons = {
        e.reason
        for e in core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=chatty"
        ).items
    }
    assert {"Scheduled", "Started"} <= reasons, events
