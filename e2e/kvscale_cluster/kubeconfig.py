"""Kubeconfig files: the admin one for people and tests, and one per pod from a TokenRequest."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path, server: str, ca_path: Path, token: str, user: str, namespace: str = "default"
) -> Path:
    """Write a kubeconfig with one cluster, one token user and a current context named kvscale
    (whose namespace is ``namespace``, as a pod's own namespace is in-cluster)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kvscale",
                "cluster": {"server": server, "certificate-authority": str(ca_path)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": "kvscale",
                "context": {"cluster": "kvscale", "user": user, "namespace": namespace},
            }
        ],
        "current-context": "kvscale",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
