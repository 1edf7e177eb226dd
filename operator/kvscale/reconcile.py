"""One level-triggered reconcile of an LLMEndpoint: render, apply, observe, compute status.

Every handler (resume, create, update, timer, a child's change) calls `reconcile`; it reads the
world, converges it, and returns what to write back, so running it twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kvscale.api import v1alpha1 as api
from kvscale.api.images import DEFAULTS, DefaultImages
from kvscale.children import engine, network
from kvscale.children.router import client_url, render_router
from kvscale.kube import Kube
from kvscale.status import endpoint
from kvscale.status.conditions import Cond
from kvscale.timestamps import now

JSON = dict[str, Any]


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """What a reconcile wants written: the status it computed, the changes of it (empty: none
    to write), Events to post, and what it read of the children for the loops to reuse."""

    status: JSON
    changes: JSON
    events: list[Event] = field(default_factory=list)
    invalid: str | None = None
    spec: api.LLMEndpointSpec | None = None
    deployment: JSON | None = None
    pods: list[JSON] = field(default_factory=list)


def validation_message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        parts.append(f"spec.{where}: {e['msg']}" if where else e["msg"])
    return "; ".join(parts)


def replica_event(
    current: int | None, last_desired: int | None, desired: int, why: str = ""
) -> Event | None:
    """The Event for a change of the Deployment's replicas, if any.

    `current` is what the Deployment had before this apply; `last_desired` what the operator
    last decided. A difference between those two means someone else wrote the field.
    """
    if current is None or current == desired:
        return None
    if last_desired is not None and current != last_desired and last_desired == desired:
        return Event(
            "Warning",
            "ReplicasRestored",
            f"Restored engine replicas to {desired}: they were changed to {current} "
            "outside kvscale (only the operator sets them)",
        )
    reason = "ScaledUp" if desired > current else "ScaledDown"
    text = f"Scaled engine from {current} to {desired} replicas"
    return Event("Normal", reason, f"{text}: {why}" if why else text)


def model_problems(kube: Kube, namespace: str, spec: api.LLMEndpointSpec) -> list[endpoint.Problem]:
    """What the operator can check about the model source before any pod runs."""
    source = spec.model.source
    claim = source.pvc.claim_name if source.pvc is not None else None
    if source.huggingface is not None:
        claim = source.huggingface.claim_name
    if claim is not None and kube.get("v1", "PersistentVolumeClaim", namespace, claim) is None:
        return [
            endpoint.Problem(
                "ModelSourceNotFound",
                f"PersistentVolumeClaim {claim} does not exist in {namespace}",
            )
        ]
    return []


def pod_image(deployment: JSON) -> str:
    """The image of a Deployment's first container (its pod template's, as applied)."""
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def reconcile(
    kube: Kube,
    body: Mapping[str, Any],
    desired: int | None = None,
    why: str = "",
    extra: list[Cond] | None = None,
    images: DefaultImages = DEFAULTS,
) -> Outcome:
    """Converge the children to the spec with `desired` engine replicas (default: pinned or
    minimum), and compute the status; `extra` conditions come from the loops, `images` are the
    operator's defaults for an endpoint that pins none."""
    meta = body["metadata"]
    generation = int(meta.get("generation", 0))
    old_status: JSON = dict(body.get("status") or {})
    try:
        spec = api.LLMEndpointSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        message = validation_message(err)
        new = endpoint.invalid_spec(generation, message, old_status, now())
        return Outcome(
            new,
            endpoint.changes(old_status, new),
            [Event("Warning", "InvalidSpec", message)],
            message,
        )

    owner = engine.Owner(meta["name"], meta["namespace"], meta["uid"])
    name = engine.engine_name(owner.name)
    before = kube.get("apps/v1", "Deployment", owner.namespace, name)
    if desired is None or spec.pinned:
        desired = engine.desired_replicas(spec)
    else:
        desired = min(max(desired, spec.scaling.min_replicas), spec.scaling.max_replicas)
    problems = model_problems(kube, owner.namespace, spec)
    # the fence first: no engine pod is ever reachable from outside it
    fence = kube.apply(network.engine_network_policy(owner, network.operator_namespace()))
    engine_objs = [kube.apply(obj) for obj in engine.render(owner, spec, desired, images)]
    router_objs = [kube.apply(obj) for obj in render_router(owner, spec, images)]
    applied = [fence, *engine_objs, *router_objs]
    deployment = engine_objs[-1]
    pods = kube.list_pods(owner.namespace, engine.selector_string(owner.name))

    events: list[Event] = []
    if before is None:
        kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in applied)
        events.append(Event("Normal", "Created", f"Created {kinds}"))
    scaled = replica_event(
        before["spec"].get("replicas") if before else None,
        old_status.get("desiredReplicas"),
        desired,
        why,
    )
    if scaled:
        events.append(scaled)
    new = endpoint.compute(
        generation=generation,
        desired=desired,
        selector=engine.selector_string(owner.name),
        url=client_url(owner),
        seen=endpoint.Observed.read(deployment, pods, router=router_objs[-1]),
        problems=problems,
        old=old_status,
        now=now(),
        extra=extra,
        images={
            "engine": pod_image(deployment),
            "router": pod_image(router_objs[-1]),
            "pinned": spec.engine.image is not None,
        },
    )
    return Outcome(
        new, endpoint.changes(old_status, new), events, spec=spec, deployment=deployment, pods=pods
    )
