"""How much memory a device has, and the peak a block of code adds to it.

CUDA asks the caching allocator. A CPU uses the kernel's peak-RSS counter, reset through
`/proc/self/clear_refs`; where that is not allowed, the peak is unknown (None) and the caller
falls back to an estimate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

PROC_STATUS = Path("/proc/self/status")


def total_bytes(device: torch.device) -> int:
    """All of a GPU's memory; for a CPU, what the host can still give (MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    return _proc_kib(Path("/proc/meminfo"), "MemAvailable") * 1024


@dataclass
class Peak:
    bytes: int | None = None


@contextmanager
def measure_peak(device: torch.device) -> Iterator[Peak]:
    peak = Peak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield peak
        torch.cuda.synchronize(device)
        peak.bytes = torch.cuda.max_memory_allocated(device) - base
        return
    resettable = _reset_peak_rss()
    base = _proc_kib(PROC_STATUS, "VmRSS")
    yield peak
    if resettable:
        peak.bytes = max(_proc_kib(PROC_STATUS, "VmHWM") - base, 0) * 1024


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _proc_kib(path: Path, field: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"cannot read {field} from {path}")
