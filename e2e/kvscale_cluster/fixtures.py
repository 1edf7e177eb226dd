"""pytest plugin for tests on the local cluster: ``pytest_plugins = ["kvscale_cluster.fixtures"]``.

Fixtures: ``cluster_config`` (session; override it to shape the nodes), ``cluster`` (session: a
running cluster, ``KUBECONFIG`` pointing at it), ``namespace`` (a fresh namespace per test) and
``kube`` (a ``kubernetes.client.ApiClient``). Helpers: ``run_operator`` (the operator under
``kopf.testing.KopfRunner``), ``kubectl`` and ``wait_for``. A failing test's report carries the
tails of every component's and pod's log. Missing infrastructure fails the session; nothing skips.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .cluster import Cluster
from .config import ClusterConfig
from .process import tail
from .wait import WaitTimeout, wait_for

__all__ = ["Cluster", "ClusterConfig", "WaitTimeout", "kubectl", "run_operator", "wait_for"]

KUBECTL = Path(sys.executable).parent / "kubectl"
OPERATOR_ARGS = ("run", "--standalone", "--all-namespaces", "-m", "kvscale.handlers")


def _point_clients_at(cluster: Cluster) -> pytest.MonkeyPatch:
    """Make kubectl, the kubernetes client and Kopf's login use ``cluster`` (undo when done).

    The client reads ``$KUBECONFIG`` once, at import, into a module default; patch that too.
    """
    from kubernetes.config import kube_config

    patch = pytest.MonkeyPatch()
    patch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    patch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.kubeconfig))
    for variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        patch.delenv(variable, raising=False)
    return patch


@pytest.fixture(scope="session")
def cluster_config() -> ClusterConfig:
    """The cluster's shape; override in a conftest for other nodes or GPU counts."""
    return ClusterConfig.from_env()


@pytest.fixture(scope="session")
def cluster(
    cluster_config: ClusterConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A running local cluster for the whole session, stopped (by PID) at its end."""
    directory = tmp_path_factory.mktemp("kvscale-cluster")
    try:
        started = Cluster.start(directory, cluster_config)
    except BaseException:
        logs = "\n".join(
            f"==> {p} <==\n{tail(p)}" for p in sorted((directory / "logs").glob("*.log"))
        )
        sys.stderr.write(f"Local cluster failed to start; component logs:\n{logs}\n")
        raise
    sys.stderr.write(
        f"\nLocal cluster up in {started.state.start_seconds:.1f} s at {started.api_url} "
        f"({started.state.network} pod network), logs in {started.logs_dir}\n"
    )
    patch = _point_clients_at(started)
    try:
        yield started
    finally:
        patch.undo()
        started.stop()


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[Any]:
    """An admin ``kubernetes.client.ApiClient`` for the test."""
    client = cluster.api_client()
    try:
        yield client
    finally:
        client.close()


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"{slug}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default service account ready), deleted after the test.

    Teardown deletes the pods with a one-second grace and waits until they are gone (their
    processes stopped), not for the namespace itself: an operator stopped before teardown may
    leave finalizers behind.
    """
    from kubernetes import client

    dead = sorted(name for name, up in cluster.alive().items() if not up)
    if dead:
        pytest.fail(f"Cluster components died: {', '.join(dead)}\n{cluster.logs()}")
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    name = _namespace_name(request.node.name)
    labels = {"kvscale.io/test": "true"}
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        30,
        f"service account {name}/default",
    )
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(name)  # Terminating: no controller can create pods in it now
        # the pods' own grace (preStop, drain delays) is what tests of shutdown measure; cleaning
        # up after a test need not wait it out
        with contextlib.suppress(client.ApiException):
            core.delete_collection_namespaced_pod(name, grace_period_seconds=1)
        wait_for(lambda: not core.list_namespaced_pod(name).items, 120, f"pods of {name} deleted")
        api.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the cluster's logs to the report of a failing test that used the cluster."""
    report = yield
    running = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(running, Cluster):
        report.sections.append(("kvscale cluster logs", running.logs()))
    return report


@contextlib.contextmanager
def run_operator(
    cluster: Cluster, args: Sequence[str] = OPERATOR_ARGS, timeout: float = 60.0
) -> Iterator[Any]:
    """Run a Kopf operator (by default ``kvscale.handlers``) in a thread against ``cluster``.

    Yields the ``kopf.testing.KopfRunner``; on exit the operator stops and its exceptions are
    raised. ``KUBECONFIG`` points at the cluster while it runs.
    """
    from kopf.testing import KopfRunner

    patch = _point_clients_at(cluster)
    patch.setenv("KVSCALE_METRICS_PORT", os.environ.get("KVSCALE_METRICS_PORT", "0"))
    try:
        with KopfRunner(list(args), timeout=timeout) as runner:
            yield runner
    finally:
        patch.undo()


def kubectl(
    cluster: Cluster, *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the venv's kubectl against ``cluster``; raise with its output when it fails."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    done = subprocess.run(
        [str(KUBECTL), *args], env=env, input=stdin, capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done
