"""Merges spec.podTemplate into the pod template the operator renders, as server-side apply would
merge two managers' fields: maps by key, lists keyed by name (env, volumes, pull secrets) or by
mountPath, scalars set. The operator's own entries stay; where a user's entry has the same key
(an env variable, a resource), the user's wins. What the operator's contract rests on (labels it
selects on, GPU resources, its volumes and mounts) the API refuses before it gets here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kvscale.api.pod_template import NodeLabels, PodTemplate, Toleration
from kvscale.api.router import RouterSpec

JSON = dict[str, Any]


def _json(model: BaseModel) -> JSON:
    """A model as the user wrote it, unset fields left out (the API server fills their
    defaults)."""
    return model.model_dump(by_alias=True, exclude_none=True, exclude_unset=True)


def _dump(items: list[Any]) -> list[JSON]:
    return [_json(i) for i in items]


def keyed(mine: list[JSON], theirs: list[JSON], key: str = "name") -> list[JSON]:
    """A list-map merge: `theirs` replaces entries of `mine` with the same key, in place, and
    the rest follow in their order."""
    by_key = {t[key]: t for t in theirs}
    merged = [by_key.pop(m[key], m) for m in mine]
    return merged + [t for t in theirs if t[key] in by_key]


def _atomic_union(mine: list[JSON], theirs: list[JSON]) -> list[JSON]:
    return mine + [t for t in theirs if t not in mine]


def _quantities(values: dict[str, int | str] | None) -> dict[str, str]:
    return {k: str(v) for k, v in (values or {}).items()}


def pull_secrets(pod: JSON, overrides: PodTemplate | None) -> JSON:
    """A pod spec with the template's imagePullSecrets (the router's pods need them too)."""
    if overrides is None or not overrides.image_pull_secrets:
        return pod
    secrets = keyed(pod.get("imagePullSecrets", []), _dump(overrides.image_pull_secrets))
    return {**pod, "imagePullSecrets": secrets}


def placement(pod: JSON, tolerations: list[Toleration], node_selector: NodeLabels | None) -> JSON:
    """A pod spec with tolerations added to its own and node labels to its nodeSelector."""
    out = dict(pod)
    if tolerations:
        out["tolerations"] = _atomic_union(pod.get("tolerations", []), _dump(tolerations))
    if node_selector:
        out["nodeSelector"] = {**pod.get("nodeSelector", {}), **node_selector}
    return out


def router_placement(pod: JSON, router: RouterSpec | None) -> JSON:
    """The router's pod spec with spec.router's nodeSelector and tolerations."""
    if router is None:
        return pod
    return placement(pod, router.tolerations, router.node_selector)


def environment(c: JSON, o: PodTemplate) -> JSON:
    """A container with the template's env and envFrom."""
    out = dict(c)
    if o.env:
        out["env"] = keyed(c.get("env", []), _dump(o.env))
    if o.env_from:
        out["envFrom"] = c.get("envFrom", []) + _dump(o.env_from)
    return out


def container(c: JSON, o: PodTemplate) -> JSON:
    """The engine container with the template's env, envFrom, resources and mounts."""
    out = environment(c, o)
    if o.resources is not None:
        res = c.get("resources", {})
        out["resources"] = {
            "requests": {**res.get("requests", {}), **_quantities(o.resources.requests)},
            "limits": {**res.get("limits", {}), **_quantities(o.resources.limits)},
        }
    if o.volume_mounts:
        out["volumeMounts"] = keyed(c.get("volumeMounts", []), _dump(o.volume_mounts), "mountPath")
    return out


def pod_template(template: JSON, o: PodTemplate | None) -> JSON:
    """A Deployment's pod template (metadata + spec) with spec.podTemplate merged in; its first
    container is the engine's, and its init containers get the template's environment."""
    if o is None:
        return template
    meta = dict(template.get("metadata", {}))
    meta["labels"] = {**meta.get("labels", {}), **(o.labels or {})}
    if o.annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **o.annotations}
    pod = pull_secrets(dict(template["spec"]), o)
    first, *rest = pod["containers"]
    pod["containers"] = [container(first, o), *rest]
    if pod.get("initContainers"):  # the model's download sees HF_ENDPOINT, HF_TOKEN and the like
        pod["initContainers"] = [environment(i, o) for i in pod["initContainers"]]
    pod = placement(pod, o.tolerations, o.node_selector)
    if o.affinity is not None:
        pod["affinity"] = _json(o.affinity)
    if o.priority_class_name is not None:
        pod["priorityClassName"] = o.priority_class_name
    if o.runtime_class_name is not None:
        pod["runtimeClassName"] = o.runtime_class_name
    if o.volumes:
        pod["volumes"] = keyed(pod.get("volumes", []), _dump(o.volumes))
    return {"metadata": meta, "spec": pod}
