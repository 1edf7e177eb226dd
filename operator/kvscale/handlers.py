"""Kopf handlers: thin. They start, wake and stop one worker per endpoint (`kvscale.worker`).

Watches of the children are filtered by a label selector on the API server, so the operator
streams only what it manages. No handler here needs a finalizer: Kopf adds one only for timers,
daemons and deletion handlers, and kvscale has none (children go with their owner through
owner references; a worker stops when its endpoint's deletion is seen).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from kvscale.api import v1alpha1 as api
from kvscale.api.images import DefaultImages
from kvscale.children.engine import ENDPOINT_LABEL, MANAGED_BY
from kvscale.context import Context
from kvscale.kube import Kube, api_client
from kvscale.operator_metrics import OperatorMetrics
from kvscale.signals.sources import Sources
from kvscale.worker import Workers

MANAGED = f"app.kubernetes.io/managed-by={MANAGED_BY}"
CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}
METRICS_PORT = "KVSCALE_METRICS_PORT"  # "off" turns the operator's /metrics off; 0: any port


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    for resource in (
        ("apps", "deployments"),
        ("", "services"),
        ("policy", "poddisruptionbudgets"),
        ("networking.k8s.io", "networkpolicies"),
    ):
        settings.watching.label_selectors[resource] = MANAGED
    settings.watching.label_selectors["", "pods"] = ENDPOINT_LABEL
    metrics = OperatorMetrics()
    port = os.environ.get(METRICS_PORT, "8081")
    if port != "off":
        logging.getLogger("kvscale").info(f"Serving metrics on :{metrics.serve(int(port))}")
    memo.metrics = metrics
    memo.sources = Sources()
    kube = Kube(api_client(), observe=metrics.kube_request)
    # `kvscale operator` puts its flags' images in the memo; `kopf run` takes the environment's
    images: DefaultImages = memo.get("images") or DefaultImages.from_env()
    logging.getLogger("kvscale").info(
        f"Defaulted unpinned endpoints to {images.engine} (kvscale) and {images.vllm} (vllm), "
        f"and every router to {images.router}"
    )
    memo.workers = Workers(Context(kube, memo.sources, metrics, images=images))


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    await memo.workers.stop_all()
    await memo.sources.aclose()
    memo.metrics.close()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def endpoint_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    workers: Workers = memo.workers
    if event.get("type") == "DELETED" or body.metadata.get("deletionTimestamp"):
        await workers.gone(body.metadata["uid"])
    else:
        workers.seen(dict(body))


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("v1", "services", labels=CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS)
@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=CHILD_LABELS)
async def child_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    for ref in body.metadata.get("ownerReferences", []):
        if ref.get("kind") == api.KIND and ref.get("apiVersion", "").startswith(api.GROUP):
            memo.workers.child_changed(ref["uid"])


@kopf.on.event("v1", "pods", labels={ENDPOINT_LABEL: kopf.PRESENT})
async def pod_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.workers.pod_changed(body.metadata["namespace"], body.metadata["labels"][ENDPOINT_LABEL])
