"""Kopf handlers: thin wrappers that call `reconcile` and write what it returns.

The endpoint's own events (resume, create, update, a timer) write status through kopf's patch;
a change to a child (edited, scaled or deleted by someone else, or its status moving) reconciles
the owning endpoint at once and writes its status through the API.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
import urllib3
from kubernetes import client, config

from kvscale.api import v1alpha1 as api
from kvscale.children import MANAGED_BY
from kvscale.kube import Kube, KubeError
from kvscale.reconcile import Outcome, reconcile

RECONCILE_INTERVAL = 30.0
CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}


def api_client() -> client.ApiClient:
    """In-cluster credentials when running as a pod, else the kubeconfig."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    except config.ConfigException:
        api: client.ApiClient = config.new_client_from_config()  # type: ignore[no-untyped-call]
        return api


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    memo.kube = Kube(api_client())


def _post(kube: Kube, body: kopf.Body | dict[str, Any], outcome: Outcome) -> None:
    obj = {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, **dict(body)}
    for event in outcome.events:
        kube.post_event(obj, event.type, event.reason, event.message)


def _reconcile(kube: Kube, body: kopf.Body | dict[str, Any], logger: kopf.Logger) -> Outcome:
    try:
        outcome = reconcile(kube, body)
    except (KubeError, urllib3.exceptions.HTTPError) as err:
        logger.warning(f"Reconcile of {body['metadata']['name']} failed: {err}")
        raise kopf.TemporaryError(f"API call failed: {err}", delay=5) from err
    _post(kube, body, outcome)
    if outcome.invalid:
        logger.error(f"Refused the spec of {body['metadata']['name']}: {outcome.invalid}")
    elif outcome.status:
        logger.info(f"Reconciled {body['metadata']['name']}: {sorted(outcome.status)} changed")
    return outcome


@kopf.on.resume(api.GROUP, api.PLURAL)
@kopf.on.create(api.GROUP, api.PLURAL)
@kopf.on.update(api.GROUP, api.PLURAL)
def reconcile_endpoint(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    outcome = _reconcile(memo.kube, body, logger)
    patch.status.update(outcome.status)
    if outcome.invalid:
        raise kopf.PermanentError(outcome.invalid)


@kopf.timer(api.GROUP, api.PLURAL, interval=RECONCILE_INTERVAL, initial_delay=RECONCILE_INTERVAL)
def reconcile_periodically(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    patch.status.update(_reconcile(memo.kube, body, logger).status)


def _owner_name(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences", []):
        if ref.get("kind") == api.KIND and ref.get("apiVersion", "").startswith(api.GROUP):
            return str(ref["name"])
    return None


@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("v1", "services", labels=CHILD_LABELS)
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels=CHILD_LABELS)
def child_changed(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    name = _owner_name(body)
    namespace = body.get("metadata", {}).get("namespace")
    if not name or not namespace:
        return
    kube: Kube = memo.kube
    owner = kube.get(f"{api.GROUP}/{api.VERSION}", api.KIND, namespace, name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return
    outcome = _reconcile(kube, owner, logger)
    if outcome.status:
        kube.patch_endpoint_status(namespace, name, outcome.status)
