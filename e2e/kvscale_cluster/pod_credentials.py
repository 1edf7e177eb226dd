"""A pod's base environment and API credentials.

A plain process cannot have ``/var/run/secrets`` mounted, so each pod gets a kubeconfig holding
a TokenRequest token bound to the pod and its service account, named by ``KUBECONFIG``, with
``KUBERNETES_SERVICE_HOST``/``PORT`` pointing at the API server's pod-reachable address.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from . import images
from .kube_api import KubeApi, Obj
from .kubeconfig import write_kubeconfig

TOKEN_SECONDS = 86400


def pod_kubeconfig(api: KubeApi, pod: Obj, directory: Path) -> Path | None:
    """Write ``directory``/kubeconfig for the pod's service account (None when the pod opts out
    with ``automountServiceAccountToken: false``)."""
    meta, spec = pod["metadata"], pod["spec"]
    if spec.get("automountServiceAccountToken") is False:
        return None
    namespace, account = meta["namespace"], spec.get("serviceAccountName") or "default"
    bound = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS, "boundObjectRef": bound},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    token = api.post(path, request)["status"]["token"]
    secrets = directory / "serviceaccount"  # the in-cluster layout, for tools that read it
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "token").write_text(token)
    (secrets / "namespace").write_text(namespace)
    user = f"system:serviceaccount:{namespace}:{account}"
    ca = Path(api.ca_path)
    return write_kubeconfig(directory / "kubeconfig", api.server, ca, token, user, namespace)


def base_env(api: KubeApi, pod: Obj, directory: Path) -> dict[str, str]:
    """The kubelet's environment (minus its KUBECONFIG), the venv first on PATH, the service
    variables and the pod's own credentials."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = f"{images.VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env["HOSTNAME"] = pod["metadata"]["name"]
    env["PYTHONUNBUFFERED"] = "1"
    server = urlsplit(api.server)
    env["KUBERNETES_SERVICE_HOST"] = server.hostname or ""
    env["KUBERNETES_SERVICE_PORT"] = str(server.port or 443)
    env["KUBERNETES_SERVICE_PORT_HTTPS"] = env["KUBERNETES_SERVICE_PORT"]
    kubeconfig = pod_kubeconfig(api, pod, directory)
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env
