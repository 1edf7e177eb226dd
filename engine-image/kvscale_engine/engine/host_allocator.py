"""Host memory for a CPU engine: malloc set for per-step activations, huge pages for the KV cache.

By default glibc serves a request over its mmap threshold (128 KiB, raised as such blocks are
freed, at most to 32 MiB) with fresh pages from the kernel, and hands memory at the heap's top back
once more than twice the threshold lies free there. A CPU step allocates its activations anew
(a 2,048-token prefill step of the bench model makes 12 MiB buffers several times a layer), so by
default each step touched fresh pages and took a page fault for each 4 KiB of them. Fixing the
threshold at its maximum and raising the trim threshold keeps freed buffers in the heap for the
next step. Measured side by side over HTTP on the 2-core bench machine (bench/engine_vs_vllm.py):
32 in flight 883-951 -> 995-1005 output tok/s, 64 in flight 910-970 -> 994-998. vLLM's CPU
backend preloads tcmalloc for the same reason. Buffers over 32 MiB (larger models' prefill) still
come from mmap: glibc refuses a higher threshold.

The KV cache is read through block tables, a 16-token block here and the next one elsewhere, so
with 4 KiB pages a decode step of 64 sequences touches thousands of pages per layer and misses the
TLB on most blocks. `huge_pages` asks the kernel for transparent 2 MiB pages over a tensor before
it is first written (madvise(MADV_HUGEPAGE): honoured where THP is `always` or `madvise`). The
CPU decode kernel over 64 sequences x 150-500 tokens, 8 layers' caches in turn: 2.94-3.05 ->
2.64-2.79 ms a layer.
"""

from __future__ import annotations

import ctypes
import logging
import mmap

import torch

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt(3) parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # the most glibc accepts on 64-bit
TRIM_THRESHOLD = 2**30
HUGE_PAGE = 2 * 2**20
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)


def keep_freed_buffers() -> bool:
    """Set the process's malloc as above; False where that is not glibc's (the settings are
    process-wide and last until exit)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        log.info("Not glibc's malloc: allocator settings left as they are")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def huge_pages(t: torch.Tensor) -> bool:
    """Ask for transparent huge pages over the whole 2 MiB pages inside `t`'s memory (call it
    before the memory is first written: pages already there stay small). False where the range
    holds no whole huge page or the kernel refuses."""
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    length = (end - first) // HUGE_PAGE * HUGE_PAGE
    if length <= 0:
        return False
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return bool(madvise(first, length, MADV_HUGEPAGE) == 0)
