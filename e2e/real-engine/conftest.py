"""The engine on the real node (``make test-real-engine``, not in ``make test``): the real-node
cluster of e2e/real with kvscale's engine image copied from Docker's engine into the node's
containerd at start. The image is 5.9 GB (PyPI's torch brings its CUDA libraries), about 12 GB
once containerd holds and unpacks it, and building it cold takes longer than CI's hour allows
beside the other tiers: docs/real-node.md. A missing image or kubelet fails the tier."""

from __future__ import annotations

import dataclasses

import pytest

from kvscale.api.images import ENGINE_IMAGE
from kvscale_cluster.fixtures import ClusterConfig

pytest_plugins = ["kvscale_cluster.fixtures"]


@pytest.fixture(scope="session")
def cluster_config() -> ClusterConfig:
    return dataclasses.replace(
        ClusterConfig.from_env(), network="netns", real_node=True, docker_images=(ENGINE_IMAGE,)
    )
