"""CPU limits as CFS quotas, as the kubelet's ``--cpu-cfs-quota`` (on by default upstream) sets
them: a container with ``resources.limits.cpu`` runs in its own cgroup of the cgroup v1 ``cpu``
controller whose quota is the limit times the period (100 ms), so a ``500m`` container gets at
most 50 ms of CPU time every 100 ms over all of the node's cores, however idle they are.

Only the quota: requests (``cpu.shares``) and memory limits are not applied. The cgroups of one
cluster live under ``<controller>/kvscale/slot-<N>/``, one per container run (named by the pod's
UID and the container's name); a process joins its cgroup before it execs the container's
command, so everything it starts is held to the same quota.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLER = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel's floor, as the kubelet's
SUFFIXES = {"": 1.0, "m": 1e-3}
# joins the cgroup whose cgroup.procs is $0, then becomes the container's command
JOIN = 'echo $$ > "$0" && exec "$@"'


class QuotaError(RuntimeError):
    """The node cannot enforce CPU limits (no writable cgroup v1 cpu controller)."""


def cpu_limit(container: dict[str, object]) -> float | None:
    """A container's CPU limit in cores (``500m`` -> 0.5), None when it has none."""
    resources = container.get("resources") or {}
    limits = (resources.get("limits") or {}) if isinstance(resources, dict) else {}
    value = limits.get("cpu") if isinstance(limits, dict) else None
    if value is None:
        return None
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m?)", str(value))
    if match is None:
        raise ValueError(f"CPU limit {value!r} is not a CPU quantity (like 2, 1.5 or 500m)")
    return float(match.group(1)) * SUFFIXES[match.group(2)]


def quota_us(cores: float) -> int:
    """The CFS quota per period for ``cores``, as the kubelet computes it (from milli-CPUs)."""
    return max(MIN_QUOTA_US, round(cores * 1000) * PERIOD_US // 1000)


@dataclass(frozen=True)
class CpuQuotas:
    """The cgroups of one cluster's containers, under ``root``."""

    root: Path

    @classmethod
    def of_slot(cls, slot: int, controller: Path = CONTROLLER) -> CpuQuotas:
        return cls(controller / "kvscale" / f"slot-{slot}")

    @classmethod
    def for_slot(cls, slot: int, controller: Path = CONTROLLER) -> CpuQuotas:
        """The cluster's cgroup folder, created (and emptied of cgroups left by a run that
        crashed); QuotaError when the controller is not there or not writable."""
        if not (controller / "cpu.cfs_quota_us").exists():
            raise QuotaError(
                f"--cpu-cfs-quota needs the cgroup v1 cpu controller at {controller} "
                "(mounted, with cpu.cfs_quota_us)"
            )
        quotas = cls.of_slot(slot, controller)
        quotas.close()
        try:
            quotas.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise QuotaError(f"cannot create {quotas.root}: {error}") from error
        return quotas

    def create(self, name: str, cores: float) -> Path:
        """A cgroup named ``name`` held to ``cores`` CPUs; returns its folder."""
        group = self.root / name
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (group / "cpu.cfs_quota_us").write_text(f"{quota_us(cores)}\n")
        return group

    @staticmethod
    def join_argv(group: Path, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into ``group``."""
        return ["/bin/sh", "-c", JOIN, str(group / "cgroup.procs"), *argv]

    @staticmethod
    def remove(group: Path) -> bool:
        """Remove a cgroup whose processes have all exited; False while some remain."""
        try:
            group.rmdir()
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: a process is still in it
            return False
        return True

    def close(self, wait_s: float = 0.0) -> bool:
        """Remove the cluster's cgroups and folder, waiting up to ``wait_s`` for processes that
        were just killed to leave them; False when some are still there."""
        deadline = time.monotonic() + wait_s
        while True:
            groups = [g for g in self.root.iterdir() if g.is_dir()] if self.root.exists() else []
            removed = all([self.remove(g) for g in groups]) and self.remove(self.root)
            if removed or time.monotonic() >= deadline:
                return removed
            time.sleep(0.1)


def throttled(group: Path) -> tuple[int, int]:
    """(periods, periods throttled) of a cgroup, from its ``cpu.stat``."""
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if line)
    return int(stat["nr_periods"]), int(stat["nr_throttled"])
