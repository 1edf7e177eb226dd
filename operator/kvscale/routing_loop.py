"""The routing loop of one endpoint around the pure weights law, every routing interval.

It feeds `controllers.routing.decide` the replicas' signals (read by the capacity loop's source
at the same cadence; the worker hands them over), which pods are still warming up and which one
is being drained, then publishes the weights where the router watches them (the
`<endpoint>-routing` ConfigMap, under its own field manager so the reconcile's apply of the empty
ConfigMap never erases them) and in `status.routing`. An endpoint with deferrable classes also
gets each replica's token budget, from the per-replica capacity the capacity loop has learned.
Weights and budgets are published only when they change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from kvscale import fleet
from kvscale.api import v1alpha1 as api
from kvscale.children.router import routing_configmap_name
from kvscale.context import Context
from kvscale.controllers.routing import (
    WEIGHTS_KEY,
    RoutingParams,
    RoutingState,
    decide,
    publication,
)
from kvscale.signals.snapshot import Snapshot
from kvscale.timestamps import stamp

JSON = dict[str, Any]
WARMUP_S = 10.0  # a replica's weight ramps up over this long after it turned Ready
ROUTING_MANAGER = "kvscale-routing"


def warming(pods: Collection[JSON], now: float) -> dict[str, float]:
    """Ready pods whose readiness is younger than the warm-up, while an older one serves, with
    the share of their warm-up elapsed (the routing law ramps their weight up with it).

    When every ready pod is young (a new endpoint, or one back from zero) none ramps: a slow
    start only shifts load to peers, and with no peer it would only queue requests.
    """
    ready = [p for p in fleet.live(pods) if fleet.is_ready(p)]
    young: dict[str, float] = {}
    for pod in ready:
        since = fleet.ready_since(pod)
        if since is not None and now - since < WARMUP_S:
            young[pod["metadata"]["name"]] = max(0.0, now - since) / WARMUP_S
    return young if len(young) < len(ready) else {}


class RoutingLoop:
    def __init__(self, ctx: Context, namespace: str, name: str) -> None:
        self.ctx = ctx
        self.namespace = namespace
        self.name = name
        self.state = RoutingState()
        self.published: tuple[dict[str, float], dict[str, float]] | None = None

    async def tick(
        self,
        spec: api.LLMEndpointSpec,
        snap: Snapshot,
        pods: list[JSON],
        draining: Collection[str],
        now: float,
        replica_tokens_per_s: float | None = None,
    ) -> JSON:
        """`status.routing` when the weights changed, else nothing. `replica_tokens_per_s` is a
        replica's capacity at the SLO (the capacity law's), for the deferred work's budgets."""
        names = [a.name for a in fleet.addresses(pods, 0)]
        deferrable = any(c.deferrable for c in spec.traffic_classes)
        params = RoutingParams(
            ttft_slo_s=spec.slo.ttft_p99_seconds,
            replica_tokens_per_s=replica_tokens_per_s if deferrable else None,
        )
        decision = decide(names, snap.replicas, warming(pods, now), draining, self.state, params)
        self.state = decision.state
        self.ctx.metrics.weights((self.namespace, self.name), decision.weights)
        published = (dict(decision.weights), dict(decision.token_budgets))
        if published == self.published:
            return {}
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": routing_configmap_name(self.name),
                "namespace": self.namespace,
            },
            "data": {WEIGHTS_KEY: publication(decision, now)},
        }
        await asyncio.to_thread(self.ctx.kube.apply, configmap, ROUTING_MANAGER)
        self.published = published
        return {
            "routing": {
                "weights": decision.weights,
                "updatedAt": stamp(now),
                "reason": f"{decision.reason}: {decision.message}",
            }
        }
