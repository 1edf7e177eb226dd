"""Replicas and weights from the Kubernetes API: the endpoint's engine pods and its routing
ConfigMap, each listed once and then watched (list, then watch from that resourceVersion; a
watch that expires or is told 410 Gone lists again).

A pod is routable when it is Ready, has an IP and is not being deleted; its Ready condition's
lastTransitionTime starts its warm-up. Unreadable weights are logged and the last good ones kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kvscale_router.replicas import Pod, ReplicaSource, ReplicaTable
from kvscale_router.weights import WeightsError, from_configmap

log = logging.getLogger(__name__)
WATCH_SECONDS = 240
RETRY_SECONDS = 2.0


def engine_selector(endpoint: str) -> str:
    return f"kvscale.io/endpoint={endpoint},kvscale.io/role=engine"


def routing_configmap(endpoint: str) -> str:
    return f"{endpoint}-routing"


def routable_pod(pod: Any, port: int) -> Pod | None:
    """The Pod to route to, or None while it is not Ready, has no IP or is terminating."""
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None or not status.pod_ip:
        return None
    for cond in status.conditions or []:
        if cond.type == "Ready" and cond.status == "True":
            since = cond.last_transition_time.timestamp() if cond.last_transition_time else 0.0
            return Pod(pod.metadata.name, f"http://{status.pod_ip}:{port}", since)
    return None


class KubeSource(ReplicaSource):
    def __init__(self, namespace: str, endpoint: str, engine_port: int = 8000) -> None:
        self.namespace = namespace
        self.endpoint = endpoint
        self.engine_port = engine_port

    @property
    def description(self) -> str:
        return f"the Kubernetes API (endpoint {self.namespace}/{self.endpoint})"

    async def run(self, table: ReplicaTable) -> None:
        settings = client.Configuration()
        kubeconfig = os.environ.get("KUBECONFIG")  # read now, not when the client was imported
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=settings)
        else:
            config.load_incluster_config(client_configuration=settings)  # type: ignore[no-untyped-call]
        async with client.ApiClient(configuration=settings) as api:
            core = client.CoreV1Api(api)
            await asyncio.gather(self._follow_pods(core, table), self._follow_weights(core, table))

    async def _follow_pods(self, core: client.CoreV1Api, table: ReplicaTable) -> None:
        def apply(objects: Mapping[str, Any]) -> None:
            pods = (routable_pod(p, self.engine_port) for p in objects.values())
            table.set_pods({p.name: p for p in pods if p is not None})

        await _list_and_watch(
            core.list_namespaced_pod, apply, self.namespace,
            label_selector=engine_selector(self.endpoint),
        )  # fmt: skip

    async def _follow_weights(self, core: client.CoreV1Api, table: ReplicaTable) -> None:
        name = routing_configmap(self.endpoint)

        def apply(objects: Mapping[str, Any]) -> None:
            cm = objects.get(name)
            try:
                table.set_published(from_configmap(cm.data if cm is not None else None))
            except WeightsError as exc:
                log.error("Kept the last routing weights: ConfigMap %s: %s", name, exc)

        await _list_and_watch(
            core.list_namespaced_config_map, apply, self.namespace,
            field_selector=f"metadata.name={name}",
        )  # fmt: skip


async def _list_and_watch(
    lister: Callable[..., Awaitable[Any]],
    apply: Callable[[Mapping[str, Any]], None],
    namespace: str,
    **selectors: str,
) -> None:
    """Keep `apply` fed with every object matching the selectors, by name, forever."""
    while True:
        try:
            listing = await lister(namespace, **selectors)
            objects = {o.metadata.name: o for o in listing.items}
            apply(objects)
            stream = watch.Watch().stream(
                lister, namespace, resource_version=listing.metadata.resource_version,
                timeout_seconds=WATCH_SECONDS, **selectors,
            )  # fmt: skip
            async with stream:
                async for event in stream:
                    obj = event["object"]
                    if event["type"] == "DELETED":
                        objects.pop(obj.metadata.name, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        objects[obj.metadata.name] = obj
                    else:
                        continue  # BOOKMARK
                    apply(objects)
        except ApiException as exc:
            if exc.status != 410:
                log.warning("Watch of %s failed (%s); listing again", lister.__name__, exc.status)
                await asyncio.sleep(RETRY_SECONDS)
        except (TimeoutError, OSError) as exc:
            log.warning("Watch of %s failed (%r); listing again", lister.__name__, exc)
            await asyncio.sleep(RETRY_SECONDS)
