"""core/v1 Events on pods, as the kubelet records them (Started, Killing, Unhealthy, ...)."""

from __future__ import annotations

import logging
import secrets

import httpx

from .kube_api import ApiError, KubeApi, Obj
from .nodes import now_iso

log = logging.getLogger("kvscale.kubelet")


def record_event(api: KubeApi, pod: Obj, reason: str, message: str, kind: str = "Normal") -> None:
    """Post an Event about ``pod``; a failure is logged, never raised."""
    meta = pod["metadata"]
    node = pod["spec"].get("nodeName", "")
    now = now_iso()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        api.post(f"/api/v1/namespaces/{meta['namespace']}/events", event)
    except (ApiError, httpx.HTTPError) as error:
        log.warning(
            "Event %s on %s/%s not recorded: %s", reason, meta["namespace"], meta["name"], error
        )
