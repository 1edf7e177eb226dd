"""The CPU's paged decode (`cpu_decode.c`): built once per machine with the C compiler, via ctypes.

The reference decode gathers each sequence's context into a padded copy and runs SDPA over it;
on the CPU that copy and SDPA's padded work were about 40% of a decode step at 32 in flight.
This kernel reads K/V in place through the block tables instead (the CPU twin of the Triton
kernel in paged_decode.py, with the same arguments). Built for a CPU with AVX-512 (`lanes` 16),
the common head shapes score sixteen rows of a block into one vector per query head instead of a
horizontal sum per row and head: 64 sequences x 150-500 tokens, one layer, 1.00 -> 0.86 ms with
the cache warm (the shared-prefix case) and within the run-to-run spread (2.3-2.6 ms) with 8
layers' caches read in turn, where the wait is on DRAM. For that wait, the wide path takes a
whole sequence per task once there are two sequences per thread, reads a block's rows for every
KV head in turn, and asks for the next block a row at a time: the same case on two threads,
14.7-16.1 -> 10.9-12.6 ms; a decode step at 64 in flight 8% shorter, at 32 x 1,000-2,000 tokens
18% (cpu_decode.c says how).

It is built once per machine by `native.py` (`-O3 -march=native -ffast-math`); `load()` returns
None when no compiler is there, and the model runner keeps the reference decode, saying why.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvscale_engine.layers import native
from kvscale_engine.model_config import ModelConfig

MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 64  # as cpu_decode.c sizes its buffers
SOURCE = Path(__file__).with_suffix(".c")
# -ffast-math lets expf vectorize (glibc's libmvec); it is given to the compile step only, since
# linking a shared library with it would set flush-to-zero for the whole process (torch too)
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")


class Kernel:
    """The loaded library's `kvscale_paged_decode`, behind paged_decode.py's signature."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        fn = lib.kvscale_paged_decode
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 7 + [ctypes.c_float, ctypes.c_int]
        self._fn = fn
        lib.kvscale_decode_lanes.restype = ctypes.c_int
        self.lanes: int = lib.kvscale_decode_lanes()  # 16: the AVX-512 path; 1: scalar rows

    def __call__(
        self,
        q: torch.Tensor,  # [batch, heads, dim]
        k_cache: torch.Tensor,  # [slots, kv_heads, dim]
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,  # [batch, max_blocks] int32
        context_lens: torch.Tensor,  # [batch] int32
        *,
        scale: float,
        block_size: int,
        window: int | None = None,
    ) -> torch.Tensor:
        native.require_fp32_cpu("cpu paged decode", q, k_cache, v_cache)
        q = q.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = context_lens.to(torch.int32).contiguous()
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("cpu paged decode reads the KV cache in place: it must be contiguous")
        batch, heads, dim = q.shape
        out = torch.empty_like(q)
        rc = self._fn(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
            tables.data_ptr(), lens.data_ptr(), batch, heads, k_cache.shape[1], dim, block_size,
            tables.shape[1], window or 0, scale, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise ValueError(
                f"cpu paged decode: {heads} heads over {k_cache.shape[1]} KV heads, head_dim {dim}"
                f" or block size {block_size} is beyond its buffers (see unsupported())"
            )
        return out


def unsupported(model: ModelConfig, block_size: int) -> str | None:
    """Why the kernel cannot serve this model (its stack buffers' limits), or None."""
    group = model.num_attention_heads // model.num_key_value_heads
    if group > MAX_GROUP or model.head_dim > MAX_DIM or block_size > MAX_BLOCK:
        return (
            f"the CPU decode kernel takes up to {MAX_GROUP} query heads per KV head, head_dim "
            f"{MAX_DIM} and block size {MAX_BLOCK} (this model: {group}, {model.head_dim}, "
            f"block size {block_size})"
        )
    return None


def load() -> Kernel | None:
    """The compiled kernel, building it first if this machine has no copy; None without a
    C compiler or when the build fails (logged)."""
    path = native.build(SOURCE, FLAGS, "the CPU decode gathers K/V instead (slower)")
    return None if path is None else Kernel(ctypes.CDLL(str(path)))
