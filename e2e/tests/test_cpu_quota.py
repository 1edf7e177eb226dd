"""CPU limits under the kubelet's --cpu-cfs-quota (`ClusterConfig.cpu_cfs_quota`): a container
with a CPU limit runs in its own cgroup whose CFS quota is the limit, so a process that would
keep a whole core busy gets at most the limit's share of it, whatever else the machine runs; a
container without one is not held. The cluster's cgroups are gone once it stops. Its own small
cluster."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from manifests import pod

from kvscale_cluster.config import NodeConfig
from kvscale_cluster.cpu_quota import CONTROLLER, PERIOD_US, CpuQuotas, throttled
from kvscale_cluster.fixtures import Cluster, ClusterConfig, wait_for

LIMIT = 0.2
WINDOW_S = 6.0
CLOCK_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


@pytest.fixture(scope="module")
def quota_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(
        nodes=(NodeConfig("solo", gpus=0),), network="loopback", prometheus=False,
        cpu_cfs_quota=True,
    )  # fmt: skip
    started = Cluster.start(tmp_path_factory.mktemp("quota") / "cluster", config)
    try:
        yield started
    finally:
        started.stop()


def _burner(core: client.CoreV1Api, name: str, limit: str | None) -> int:
    """A testserver pod burning one CPU, with ``limit`` as its CPU limit; its process's PID."""
    manifest = pod(name, "kvscale/testserver", args=["--port", "0", "--burn"])
    if limit is not None:
        manifest["spec"]["containers"][0]["resources"] = {"limits": {"cpu": limit}}
    core.create_namespaced_pod("default", manifest)

    def pid() -> int | None:
        statuses = core.read_namespaced_pod(name, "default").status.container_statuses or []
        container_id = statuses[0].container_id if statuses else ""
        return int(container_id.rsplit("/", 1)[1]) if container_id else None

    found: int = wait_for(pid, 60, f"{name} running")
    return found


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _cpu_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise AssertionError(f"process {pid} is in no cpu cgroup")


def test_a_cpu_limit_caps_a_busy_container_and_no_limit_does_not(
    quota_cluster: Cluster,
) -> None:
    api = quota_cluster.api_client()
    core = client.CoreV1Api(api)
    held = _burner(core, "held", "200m")
    free = _burner(core, "free", None)

    slot = f"/kvscale/slot-{quota_cluster.state.slot}/"
    group = _cpu_cgroup(held)
    assert group.startswith(slot), group
    assert not _cpu_cgroup(free).startswith(slot)
    folder = CONTROLLER / group.lstrip("/")
    assert int((folder / "cpu.cfs_quota_us").read_text()) == int(LIMIT * PERIOD_US)
    assert int((folder / "cpu.cfs_period_us").read_text()) == PERIOD_US

    wait_for(lambda: throttled(folder)[1] > 0, 30, "held busy under its quota")
    used, began = _cpu_seconds(held), time.monotonic()
    periods, throttles = throttled(folder)
    time.sleep(WINDOW_S)
    share = (_cpu_seconds(held) - used) / (time.monotonic() - began)
    periods_after, throttles_after = throttled(folder)
    # the quota bounds what it gets from above (a busy machine only lowers it): a period's
    # quota of slack at each end of the window, and the clock tick's rounding
    assert share <= LIMIT + 2 * LIMIT * PERIOD_US / 1e6 / WINDOW_S + 0.03, share
    assert periods_after > periods and throttles_after > throttles  # it wanted more, was held

    core.delete_namespaced_pod("held", "default", grace_period_seconds=1)
    wait_for(lambda: not folder.exists(), 30, f"{folder} removed with its pod")
    api.close()


def test_the_clusters_cgroups_are_gone_after_it_stops(tmp_path: Path) -> None:
    config = ClusterConfig(
        nodes=(NodeConfig("solo", gpus=0),), network="loopback", prometheus=False,
        cpu_cfs_quota=True,
    )  # fmt: skip
    cluster = Cluster.start(tmp_path / "cluster", config)
    try:
        api = cluster.api_client()
        _burner(client.CoreV1Api(api), "left", "100m")
        api.close()
        root = CpuQuotas.of_slot(cluster.state.slot).root
        assert [g.name for g in root.iterdir() if g.is_dir()]
    finally:
        cluster.stop()
    assert not root.exists()
