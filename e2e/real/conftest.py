"""The real-node tier (``make test-real``): the local cluster with a third node under the
upstream kubelet, containerd, runc and CNI (``kvscale_cluster.real_node``, docs/real-node.md).
Its infrastructure missing (the kubelet binary, the images, containerd) fails the tier."""

from __future__ import annotations

import dataclasses

import pytest

from kvscale_cluster.fixtures import ClusterConfig

pytest_plugins = ["kvscale_cluster.fixtures"]


@pytest.fixture(scope="session")
def cluster_config() -> ClusterConfig:
    return dataclasses.replace(ClusterConfig.from_env(), network="netns", real_node=True)
