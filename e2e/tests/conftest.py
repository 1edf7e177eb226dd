from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvscale_cluster.fixtures import Cluster, kubectl
from kvscale_cluster.install import install_kvscale, uninstall_kvscale

pytest_plugins = ["kvscale_cluster.fixtures"]


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[None]:
    """kvscale from `kubectl apply -k manifests/`, removed again after the module, CRD too."""
    install_kvscale(lambda *args: kubectl(cluster, *args))
    try:
        yield
    finally:
        uninstall_kvscale(lambda *args: kubectl(cluster, *args), crds=True)
