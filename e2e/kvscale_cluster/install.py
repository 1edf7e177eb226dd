"""Installs kvscale on a cluster from manifests/, as `make demo` and the e2e tests do.

`kubectl apply --server-side -k manifests/crds/` (the CRD, kept when the install goes), then
`kubectl apply --server-side -k e2e/install/`: manifests/ unchanged from a real cluster, plus the
local cluster's allowed host path (where its tests write checkpoints). The local cluster runs
no Prometheus Operator, so the optional ServiceMonitor component is left out (its CRD is kept here
for the control-plane test of manifests/components/servicemonitor).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvscale_cluster.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
CRDS = MANIFESTS / "crds"  # its own kustomization: deleting the install leaves it
CRD_NAME = "crd/llmendpoints.kvscale.io"
LOCAL_INSTALL = ROOT / "e2e" / "install"  # manifests/ + the host paths local endpoints mount
SERVICEMONITOR_CRD = ROOT / "e2e" / "crds" / "servicemonitors.monitoring.coreos.com.yaml"
PODMONITOR_CRD = ROOT / "e2e" / "crds" / "podmonitors.monitoring.coreos.com.yaml"

Kubectl = Callable[..., object]


def install_kvscale(kubectl: Kubectl) -> None:
    """Applies the CRD, then the manifests, and waits for the operator to roll out."""
    kubectl("apply", "--server-side", "-k", str(CRDS))
    wait_established(kubectl, CRD_NAME)
    kubectl("apply", "--server-side", "-k", str(LOCAL_INSTALL))
    kubectl(
        "-n", "kvscale-system", "rollout", "status", "deployment/kvscale-operator", "--timeout=180s"
    )


def wait_established(kubectl: Kubectl, name: str, timeout: float = 60.0) -> None:
    """Waits for a CRD (`crd/<name>`) to be Established. `kubectl wait` fails at once, instead of
    waiting, while a CRD just created has no `status.conditions` yet, so it is asked again."""
    wait_for(
        lambda: kubectl("wait", "--for=condition=Established", "--timeout=10s", name),
        timeout,
        f"{name} to be Established",
    )


def uninstall_kvscale(kubectl: Kubectl, *, crds: bool = False) -> None:
    """`kubectl delete -k manifests/`: the operator and its RBAC, in any order; the CRD and the
    endpoints stay. With `crds`, `kubectl delete -k manifests/crds/` then removes the CRD on
    purpose: endpoints carry no finalizer, so none waits for an operator, deleting the CRD deletes
    the endpoints still present, and the garbage collector removes their children.
    """
    kubectl("delete", "-k", str(MANIFESTS), "--ignore-not-found", "--timeout=180s")
    if crds:
        kubectl("delete", "-k", str(CRDS), "--ignore-not-found", "--timeout=180s")
