"""Control-plane tier: the operator against a real kube-apiserver, etcd and controllers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from endpoint_helpers import ROOT
from kopf.testing import KopfRunner

from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, kubectl, run_operator
from kvscale_cluster.install import CRD_NAME, wait_established

pytest_plugins = ["kvscale_cluster.fixtures"]

CRD_PATH = ROOT / "crds" / "llmendpoints.kvscale.io.yaml"


@pytest.fixture(scope="session")
def api(cluster: Cluster) -> Kube:
    """The operator's own API wrapper, as the admin."""
    return Kube(cluster.api_client())


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    """The committed CRD, installed with server-side apply and Established."""
    kubectl(cluster, "apply", "--server-side", "-f", str(CRD_PATH))
    wait_established(lambda *args: kubectl(cluster, *args), CRD_NAME)


@pytest.fixture
def operator(cluster: Cluster, crd: None) -> Iterator[KopfRunner]:
    """The kvscale operator, running in this process as `kvscale operator` would."""
    with run_operator(cluster) as runner:
        yield runner
    assert runner.exception is None, runner.output
