"""The allocator settings a CPU engine takes: freed activation-sized buffers stay in the heap.

Each case runs in a fresh interpreter (the settings are process-wide) that allocates four 12 MiB
buffers at once, as a 2,048-token prefill step of the bench model does, frees them, three times.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.host_allocator import huge_pages
from kvscale_engine.engine.llm_engine import LLMEngine

_ROUNDS = """
import ctypes, json, sys
from kvscale_engine.engine.host_allocator import keep_freed_buffers
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
taken = keep_freed_buffers() if sys.argv[1] == "keep" else None
if sys.argv[1] == "engine":
    from kvscale_engine.config import EngineConfig
    from kvscale_engine.engine.llm_engine import LLMEngine
    LLMEngine(EngineConfig(model="dummy:llama-tiny", device="cpu", num_kv_blocks=8))
rounds = []
for _ in range(3):
    ptrs = [libc.malloc(12 * 2**20) for _ in range(4)]
    top = libc.sbrk(0)
    in_heap = all(p < top for p in ptrs)
    for p in ptrs:
        libc.free(p)
    rounds.append({"in_heap": in_heap, "kept": libc.sbrk(0) == top})
print(json.dumps({"taken": taken, "rounds": rounds}))
"""


def _rounds(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _ROUNDS, mode], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_freed_buffers_stay_in_the_heap_for_the_next_step() -> None:
    result = _rounds("keep")
    assert result["taken"] is True
    assert result["rounds"] == [{"in_heap": True, "kept": True}] * 3


def test_by_default_glibc_hands_them_back_each_time() -> None:
    """Why the settings exist: each round's buffers are either fresh mmaps or heap memory given
    back after the free, so the next step touches fresh pages again."""
    rounds = _rounds("default")["rounds"]
    assert isinstance(rounds, list)
    assert all(not r["in_heap"] or not r["kept"] for r in rounds)


def test_a_cpu_engine_takes_the_settings_when_it_starts() -> None:
    assert _rounds("engine")["rounds"] == [{"in_heap": True, "kept": True}] * 3


def test_the_kv_cache_asks_for_huge_pages() -> None:
    """The CPU engine's KV cache is marked for transparent huge pages (its block tables jump
    between scattered blocks: small pages miss the TLB). Whether the kernel then finds free 2 MiB
    pages depends on the machine's memory, so what is checked is the request: the `hg` flag on
    the cache's mappings, where the kernel has THP at all."""
    # 40 MiB a tensor: past glibc's 32 MiB mmap threshold, fresh pages as a real cache gets
    engine = LLMEngine(EngineConfig(model="dummy:llama-tiny", device="cpu", num_kv_blocks=20480))
    k_cache = engine.model_runner.kv_caches[0][0]
    assert k_cache.numel() * k_cache.element_size() == 40 * 2**20
    start = k_cache.data_ptr()
    flags = _vm_flags(start + 4 * 2**20, start + 36 * 2**20)  # inside the aligned part
    assert flags, "no mapping holds the cache"
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():
        assert all("hg" in f for f in flags), flags
    else:  # a kernel without THP refuses the request
        assert not any("hg" in f for f in flags), flags


def test_memory_without_a_whole_huge_page_is_left_alone() -> None:
    assert huge_pages(torch.empty(1024)) is False


def _vm_flags(start: int, end: int) -> list[set[str]]:
    """The VmFlags of each mapping in /proc/self/smaps that overlaps [start, end)."""
    out, inside = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "VmFlags:":
            out.append(set(line.split()[1:]))
    return out
