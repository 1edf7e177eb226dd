"""The real node's configs (docs/real-node.md): private to its cluster, inside the cluster's
addresses, and with the settings this machine needs (cgroup v1, no CAP_SYS_RESOURCE)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from kvscale_cluster import netns, real_node
from kvscale_cluster.pki import create_pki


def test_cni_hands_out_addresses_the_process_kubelet_never_does(tmp_path: Path) -> None:
    node = real_node.RealNode(tmp_path)
    conflist = json.loads(real_node._cni_config(node, 7, "10.244.7.1"))
    bridge = conflist["plugins"][0]
    assert bridge["bridge"] == netns.bridge_name(7)
    assert not bridge["ipMasq"]
    (cni_range,) = bridge["ipam"]["ranges"][0]
    first = ipaddress.ip_address(cni_range["rangeStart"])
    last = ipaddress.ip_address(cni_range["rangeEnd"])
    assert ipaddress.ip_network(cni_range["subnet"]) == ipaddress.ip_network("10.244.7.0/24")
    process_kubelet = {ipaddress.ip_address(f"10.244.7.{i}") for i in netns.POD_INDEXES}
    assert all(not first <= address <= last for address in process_kubelet)
    assert bridge["ipam"]["dataDir"].startswith(str(tmp_path))


def test_containerd_keeps_everything_under_the_node_folder(tmp_path: Path) -> None:
    config = tomllib.loads(real_node._containerd_config(real_node.RealNode(tmp_path)))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"]  # no CAP_SYS_RESOURCE: the sandbox's -998 fails
    assert cri["sandbox_image"] == real_node.SANDBOX_IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    paths = [config["root"], config["state"], config["grpc"]["address"], runc["Root"]]
    assert all(path.startswith(str(tmp_path)) for path in paths)


def test_kubelet_runs_on_cgroup_v1_under_its_own_cgroup_root(tmp_path: Path) -> None:
    pki = create_pki(tmp_path / "pki", ["10.244.7.1"])
    node = real_node.RealNode(tmp_path)
    config = yaml.safe_load(real_node._kubelet_config(node, pki, "10.244.7.1", 7))
    assert config["failCgroupV1"] is False
    assert config["cgroupRoot"] == real_node.cgroup_root(7) != real_node.cgroup_root(8)
    assert config["clusterDNS"] == ["10.244.7.1"]
    assert config["containerRuntimeEndpoint"] == f"unix://{node.socket}"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["evictionHard"]["imagefs.available"] == "1%"
    assert config["evictionHard"]["nodefs.available"] == "1%"


def test_images_need_twice_their_size_above_the_eviction_threshold() -> None:
    gib = 1 << 30
    needed = real_node.space_needed(7 * gib, 250 * gib)
    assert needed == 14 * gib + int(2.5 * gib) + real_node.SPARE


def test_a_node_whose_images_would_fill_its_disk_is_refused(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    image = tmp_path / "big.tar"
    with image.open("wb") as sparse:  # its size, not its blocks, counts
        sparse.truncate(free // 2)
    with pytest.raises(real_node.RealNodeError, match=r"GiB free under .* eviction threshold"):
        real_node.check_space(tmp_path, [image], ())
