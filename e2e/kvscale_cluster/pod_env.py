"""A container's environment, resolved as the kubelet does: the Service variables of the pod's
namespace (``enableServiceLinks``), ``envFrom`` and ``env`` (values, ``$(VAR)`` expansion,
``fieldRef``, ``resourceFieldRef``, ConfigMap and Secret keys)."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from .kube_api import KubeApi, Obj
from .service_table import service_env

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class EnvError(RuntimeError):
    """A referenced ConfigMap, Secret or field is missing (CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes a ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR.sub(replace, text)


def _label_value(mapping: Obj, path: str) -> str:
    key = path.split("['", 1)[1].rstrip("']")
    return str(mapping.get(key, ""))


def field_value(pod: Obj, path: str, pod_ip: str, host_ip: str) -> str:
    """The value of a ``fieldRef.fieldPath`` for ``pod``."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    if path.startswith("metadata.labels['"):
        return _label_value(meta.get("labels") or {}, path)
    if path.startswith("metadata.annotations['"):
        return _label_value(meta.get("annotations") or {}, path)
    raise EnvError(f"Unsupported fieldRef {path!r}")


def _resource_value(container: Obj, ref: Obj) -> str:
    kind, name = ref["resource"].split(".", 1)
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        raise EnvError(f"Container {container['name']} sets no {ref['resource']}")
    return str(value)


def _key_ref(api: KubeApi, namespace: str, kind: str, ref: Obj) -> str | None:
    data = _source(api, namespace, kind, ref["name"], bool(ref.get("optional")))
    if data is None or ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise EnvError(f"{kind} {namespace}/{ref['name']} has no key {ref['key']!r}")
    return data[ref["key"]]


def _source(api: KubeApi, namespace: str, kind: str, name: str, optional: bool) -> dict[str, str]:
    plural = "configmaps" if kind == "ConfigMap" else "secrets"
    try:
        obj = api.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
    except Exception as error:
        if optional:
            return {}
        raise EnvError(f"{kind} {namespace}/{name}: {error}") from error
    data: dict[str, str] = dict(obj.get("data") or {})
    if kind == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
    return data


def container_env(
    api: KubeApi, pod: Obj, container: Obj, base: Mapping[str, str], pod_ip: str, host_ip: str
) -> dict[str, str]:
    """``base`` overlaid with the namespace's Service variables, the container's ``envFrom`` and
    then its ``env``."""
    namespace = pod["metadata"]["namespace"]
    env = dict(base)
    if pod["spec"].get("enableServiceLinks", True):
        services = api.get(f"/api/v1/namespaces/{namespace}/services")["items"]
        env.update(service_env(services))
    for source in container.get("envFrom") or []:
        kind, ref = ("ConfigMap", source.get("configMapRef"))
        if ref is None:
            kind, ref = ("Secret", source.get("secretRef"))
        if ref is None:
            continue
        data = _source(api, namespace, kind, ref["name"], bool(ref.get("optional")))
        env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
        elif "resourceFieldRef" in source:
            value = _resource_value(container, source["resourceFieldRef"])
        elif "configMapKeyRef" in source:
            value = _key_ref(api, namespace, "ConfigMap", source["configMapKeyRef"])
        elif "secretKeyRef" in source:
            value = _key_ref(api, namespace, "Secret", source["secretKeyRef"])
        else:
            raise EnvError(f"Unsupported valueFrom for {name}: {sorted(source)}")
        if value is not None:
            env[name] = value
    return env


def expand_argv(argv: list[str], env: Mapping[str, str]) -> list[str]:
    return [expand(a, env) for a in argv]


def named_port(container: Obj, port: Any) -> int:
    """A probe's ``port``: a number or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise EnvError(f"Container {container['name']} has no port named {port!r}")
