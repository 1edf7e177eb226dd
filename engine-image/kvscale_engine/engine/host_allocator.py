"""glibc's malloc, set for a process that frees and re-allocates activation-sized buffers each step.

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
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt(3) parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # the most glibc accepts on 64-bit
TRIM_THRESHOLD = 2**30


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
