"""Pod discovery for Prometheus over HTTP SD, reading pods from the API server.

Debian builds Prometheus without ``kubernetes_sd_configs``, so the launcher runs this small
service instead: Prometheus polls ``GET /targets`` (``http_sd_configs``) and gets one target group
per pod container port with the same ``__meta_kubernetes_pod_*`` labels that
``kubernetes_sd_configs`` (role: pod) produces. The relabelling rules are therefore the ones a
real cluster's Prometheus uses. Run as ``python -m kvscale_cluster.pod_discovery``.
"""

from __future__ import annotations

import argparse
import json
import re
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .body_handler import BodyHandler
from .kube_api import KubeApi, Obj

META = "__meta_kubernetes_"


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _pod_labels(pod: Obj) -> dict[str, str]:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    labels = {
        f"{META}namespace": meta["namespace"],
        f"{META}pod_name": meta["name"],
        f"{META}pod_uid": meta["uid"],
        f"{META}pod_ip": status.get("podIP", ""),
        f"{META}pod_node_name": spec.get("nodeName", ""),
        f"{META}pod_host_ip": status.get("hostIP", ""),
        f"{META}pod_phase": status.get("phase", ""),
        f"{META}pod_ready": next(
            (
                c["status"].lower()
                for c in status.get("conditions") or []
                if c.get("type") == "Ready"
            ),
            "unknown",
        ),
    }
    for kind in ("label", "annotation"):
        for key, value in (meta.get(f"{kind}s") or {}).items():
            labels[f"{META}pod_{kind}_{_sanitize(key)}"] = value
            labels[f"{META}pod_{kind}present_{_sanitize(key)}"] = "true"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller"):
            labels[f"{META}pod_controller_kind"] = owner["kind"]
            labels[f"{META}pod_controller_name"] = owner["name"]
    return labels


def target_groups(pods: list[Obj]) -> list[dict[str, Any]]:
    """HTTP SD target groups for ``pods``, as kubernetes_sd_configs role=pod would list them."""
    groups: list[dict[str, Any]] = []
    for pod in pods:
        pod_ip = (pod.get("status") or {}).get("podIP")
        if not pod_ip:
            continue
        base = _pod_labels(pod)
        ports = [(c, p) for c in pod["spec"]["containers"] for p in c.get("ports") or []]
        if not ports:
            groups.append({"targets": [pod_ip], "labels": base})
        for container, port in ports:
            labels = dict(base)
            labels[f"{META}pod_container_name"] = container["name"]
            labels[f"{META}pod_container_image"] = container.get("image", "")
            labels[f"{META}pod_container_port_name"] = port.get("name", "")
            labels[f"{META}pod_container_port_number"] = str(port["containerPort"])
            labels[f"{META}pod_container_port_protocol"] = port.get("protocol", "TCP")
            target = f"{pod_ip}:{port['containerPort']}"
            groups.append({"targets": [target], "labels": labels})
    return groups


def serve(api: KubeApi, host: str, port: int) -> None:
    class Handler(BodyHandler):
        def do_GET(self) -> None:
            if self.path != "/targets":
                self.send_error(404)
                return
            body = json.dumps(target_groups(api.get("/api/v1/pods")["items"])).encode()
            self.reply(body, "application/json")

    ThreadingHTTPServer((host, port), Handler).serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvscale_cluster.pod_discovery")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    serve(KubeApi.from_kubeconfig(args.kubeconfig), args.host, args.port)


if __name__ == "__main__":
    main()
