"""The process kubelet's CPU limits (e2e/kvscale_cluster/cpu_quota.py): the quantity it reads and
the CFS quota it writes, as the kubelet computes them; a node without the cpu controller is
refused with the reason. The cgroups themselves: e2e/tests/test_cpu_quota.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvscale_cluster.cpu_quota import (
    MIN_QUOTA_US,
    PERIOD_US,
    CpuQuotas,
    QuotaError,
    cpu_limit,
    quota_us,
)


@pytest.mark.parametrize(
    ("limit", "cores"),
    [("500m", 0.5), ("2", 2.0), ("1.5", 1.5), ("250m", 0.25), (".5", 0.5), (1, 1.0)],
)
def test_cpu_limits_read_as_cores(limit: str | int, cores: float) -> None:
    assert cpu_limit({"resources": {"limits": {"cpu": limit}}}) == cores


@pytest.mark.parametrize(
    "container",
    [{}, {"resources": {}}, {"resources": {"requests": {"cpu": "1"}}},
     {"resources": {"limits": {"memory": "1Gi"}}}],
)  # fmt: skip
def test_no_cpu_limit_is_none(container: dict[str, object]) -> None:
    assert cpu_limit(container) is None


def test_a_quantity_that_is_not_cpu_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="'1Gi'"):
        cpu_limit({"resources": {"limits": {"cpu": "1Gi"}}})


def test_the_quota_is_the_limit_times_the_period_in_milli_cpus() -> None:
    assert quota_us(0.5) == PERIOD_US // 2
    assert quota_us(2.0) == 2 * PERIOD_US
    assert quota_us(0.2) == 20_000
    assert quota_us(0.0001) == MIN_QUOTA_US  # the kernel's floor


def test_a_node_without_the_cpu_controller_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(QuotaError, match="cgroup v1 cpu controller"):
        CpuQuotas.for_slot(3, controller=tmp_path)


def test_stale_cgroups_of_a_crashed_run_are_removed_at_start(tmp_path: Path) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    stale = tmp_path / "kvscale" / "slot-3" / "uid-main"
    stale.mkdir(parents=True)
    quotas = CpuQuotas.for_slot(3, controller=tmp_path)
    assert quotas.root == tmp_path / "kvscale" / "slot-3"
    assert quotas.root.is_dir() and not stale.exists()
    assert quotas.close()
    assert not quotas.root.exists()


def test_the_container_joins_its_cgroup_as_the_process_it_becomes(tmp_path: Path) -> None:
    """The shell writes its PID to the group's cgroup.procs, then execs the command in place:
    the PID the group holds is the container's own (a file stands in for cgroup.procs)."""
    argv = CpuQuotas.join_argv(tmp_path, ["sh", "-c", "echo $$"])
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert (tmp_path / "cgroup.procs").read_text().strip() == done.stdout.strip() != ""
