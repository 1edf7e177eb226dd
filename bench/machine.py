"""A description of the machine a benchmark ran on, stored with every result."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (all its threads) has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def describe() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(_mem_total_kib() / 2**20, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if os.getloadavg()[0] >= info["cpus_usable"]:
        info["note"] = (
            "busy: other jobs ran on this machine (load average at or above its CPU count), so "
            "absolute rates are low and noisy; ratios are measured side by side in one run"
        )
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants now (Linux /proc); gone ones are left out. A child
    is listed under the thread that started it, so every thread's children are read."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            continue
        out.append(current)
        for task in tasks:
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants now (Linux /proc; shared pages are
    counted once per process, so a tree that forks counts its shared libraries more than once)."""
    total = 0
    for current in tree_pids(pid):
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time a process and its living descendants have used so far."""
    total = 0.0
    for current in tree_pids(pid):
        try:
            total += cpu_seconds(current)
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total
