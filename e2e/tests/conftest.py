from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, kubectl, run_operator
from kvscale_cluster.install import (
    CRD_NAME,
    ROOT,
    install_kvscale,
    uninstall_kvscale,
    wait_established,
)

pytest_plugins = ["kvscale_cluster.fixtures"]


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[None]:
    """kvscale from `kubectl apply -k manifests/`, removed again after the module, CRD too."""
    install_kvscale(lambda *args: kubectl(cluster, *args))
    try:
        yield
    finally:
        uninstall_kvscale(lambda *args: kubectl(cluster, *args), crds=True)


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Any]:
    """The operator in this process (Kopf's runner) with the CRD applied, for the module."""
    crd = ROOT / "crds" / "llmendpoints.kvscale.io.yaml"
    kubectl(cluster, "apply", "--server-side", "-f", str(crd))
    wait_established(lambda *args: kubectl(cluster, *args), CRD_NAME)
    with run_operator(cluster) as runner:
        yield runner
    assert runner.exception is None, runner.output


@pytest.fixture
def api(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())
