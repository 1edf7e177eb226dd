"""The few Kubernetes API calls the operator makes, on plain dicts.

Children are applied with server-side apply under one field manager (`kvscale`), forced, so the
operator owns exactly the fields it renders and takes them back when someone else edits them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config

from kvscale import timestamps
from kvscale.api import v1alpha1 as api

JSON = dict[str, Any]
FIELD_MANAGER = "kvscale"
TIMEOUT_S = (5.0, 30.0)  # connect, read: no API call may hang a reconcile
# A connection that failed is retried (nothing was sent); a read that timed out is not: the
# worker's next tick asks again, so a silent API server holds a call for one read timeout, not
# the four of urllib3's default (three retries of every idempotent request)
RETRIES = urllib3.Retry(total=2, connect=2, read=0, redirect=0, status=0, other=0,
                        backoff_factor=0.2)  # fmt: skip

_COLLECTIONS = {
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services",
    ("v1", "Event"): "/api/v1/namespaces/{namespace}/events",
    ("v1", "Pod"): "/api/v1/namespaces/{namespace}/pods",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{namespace}/serviceaccounts",
    ("rbac.authorization.k8s.io/v1", "Role"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles"
    ),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
    ),
    ("v1", "PersistentVolumeClaim"): "/api/v1/namespaces/{namespace}/persistentvolumeclaims",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{namespace}/deployments",
    ("networking.k8s.io/v1", "NetworkPolicy"): (
        "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    ),
    ("policy/v1", "PodDisruptionBudget"): (
        "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    ),
    (f"{api.GROUP}/{api.VERSION}", api.KIND): (
        f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{{namespace}}/{api.PLURAL}"
    ),
}


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster credentials when running as a pod, else the kubeconfig ($KUBECONFIG or
    ~/.kube/config unless given); with `RETRIES`."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.retries = RETRIES
    return client.ApiClient(configuration)


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Kube:
    """A thin, typed-by-dict view of the API server; `timeout_s` is (connect, read) seconds.

    Every call goes through `request`, which reports it to `observe` (verb, resource, HTTP
    status or 0 when the server did not answer, seconds) when given.
    """

    api_client: client.ApiClient
    timeout_s: tuple[float, float] = TIMEOUT_S
    observe: Callable[[str, str, int, float], None] | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> JSON | None:
        m, url, headers, payload, _ = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        start, status = time.perf_counter(), 0
        try:
            resp = self.api_client.call_api(
                m, url, headers, payload, _request_timeout=self.timeout_s
            )
            resp.read()  # type: ignore[no-untyped-call]
            status = resp.status
        except urllib3.exceptions.HTTPError as err:  # unreachable, timed out, reset
            raise KubeError(0, f"{method} {path}: {err}") from err
        finally:
            if self.observe is not None:
                self.observe(method, resource_of(path), status, time.perf_counter() - start)
        if resp.status == 404:
            return None
        if resp.status >= 400:
            raise KubeError(resp.status, _message(resp.data))
        return json.loads(resp.data) if resp.data else {}

    @staticmethod
    def _path(api_version: str, kind: str, namespace: str, name: str = "") -> str:
        base = _COLLECTIONS[(api_version, kind)].format(namespace=namespace)
        return f"{base}/{name}" if name else base

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        return self.request("GET", self._path(api_version, kind, namespace, name))

    def list_pods(self, namespace: str, selector: str) -> list[JSON]:
        found = self.request(
            "GET", self._path("v1", "Pod", namespace), query=[("labelSelector", selector)]
        )
        return list((found or {}).get("items", []))

    def apply(self, obj: JSON, manager: str = FIELD_MANAGER) -> JSON:
        """Server-side apply, forced, as the operator's field manager (or `manager`)."""
        meta = obj["metadata"]
        path = self._path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", manager), ("force", "true")]
        result = self.request("PATCH", path, obj, query, "application/apply-patch+yaml")
        if result is None:
            raise KubeError(404, f"{obj['kind']} {meta['name']} vanished while applying")
        return result

    def create(self, obj: JSON, strict: bool = False) -> JSON:
        """Creates an object; `strict` refuses unknown fields, as `kubectl` does by default."""
        meta = obj["metadata"]
        query = [("fieldValidation", "Strict")] if strict else []
        path = self._path(obj["apiVersion"], obj["kind"], meta["namespace"])
        created = self.request("POST", path, obj, query)
        if created is None:
            raise KubeError(404, f"namespace {meta['namespace']} not found")
        return created

    def patch_endpoint_status(self, namespace: str, name: str, status: JSON) -> None:
        path = self._path(f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name) + "/status"
        self.request("PATCH", path, {"status": status}, None, "application/merge-patch+json")

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        path = self._path("v1", "Pod", namespace, name)
        body = {"metadata": {"annotations": annotations}}
        self.request("PATCH", path, body, None, "application/merge-patch+json")

    def post_event(self, involved: JSON, kind: str, reason: str, message: str) -> None:
        """Records an Event on an object, as `kubectl describe` shows them.

        Repeats aggregate as client-go's correlator does: the same object, type, reason and
        message name one Event, whose `count` and `lastTimestamp` move on each repeat.
        """
        meta = involved["metadata"]
        now = timestamps.now()
        key = "\0".join((meta.get("uid", ""), kind, reason, message))
        name = f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        path = self._path("v1", "Event", meta["namespace"], name)
        seen = self.request("GET", path)
        if seen is not None:
            repeat = {"count": int(seen.get("count") or 1) + 1, "lastTimestamp": now}
            self.request("PATCH", path, repeat, None, "application/merge-patch+json")
            return
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.request("POST", self._path("v1", "Event", meta["namespace"]), event)


_RESOURCE = re.compile(r"/namespaces/[^/]+/([^/]+)(?:/[^/]+(/[^/]+)?)?$")


def resource_of(path: str) -> str:
    """The resource a namespaced API path names ("pods", "llmendpoints/status")."""
    found = _RESOURCE.search(path)
    return "".join(g for g in found.groups() if g) if found else "other"


def _message(data: bytes | None) -> str:
    try:
        return str(json.loads(data or b"{}").get("message", data))
    except ValueError:
        return (data or b"").decode(errors="replace")
