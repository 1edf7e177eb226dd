"""RMSNorm, the rotary embedding and the KV cache write on the CPU as one C call each (`cpu_ops.c`).

At one sequence in flight a decode step is mostly the GEMMs reading the weights, but the torch
ops around them were many and small: RMSNorm eight of them, the rotary embedding of q and k
fourteen a layer, the cache write two, each some microseconds of dispatch (1,112 ops a step of
the benchmark's model at 1 in flight; 492 with these). The model runner installs them for fp32
on the CPU (`LlamaForCausalLM.use_cpu_ops`); elsewhere, or without a C compiler, the model keeps
its torch code.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvscale_engine.layers import native

SOURCE = Path(__file__).with_suffix(".c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-std=c11")
_i64, _int, _float, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p


class CpuOps:
    """The loaded library's functions behind torch-shaped calls; fp32 CPU tensors only."""

    def __init__(self, lib: ctypes.PyDLL) -> None:
        self._norm = lib.kvscale_rms_norm
        self._norm.argtypes = [_ptr, _i64, _ptr, _ptr, _i64, _int, _float]
        self._norm.restype = None
        self._rope = lib.kvscale_rope
        self._rope.argtypes = [_ptr, _i64, _ptr, _ptr, _i64, _int, _int]
        self._rope.restype = None
        self._kv_write = lib.kvscale_kv_write
        self._kv_write.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _int, _i64]
        self._kv_write.restype = ctypes.c_int

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """Hugging Face's RMSNorm of each row of x ([tokens, hidden]; rows may be strided)."""
        native.require_fp32_cpu("cpu_ops", x, weight)
        if x.dim() != 2 or x.stride(1) != 1 or not weight.is_contiguous():
            raise ValueError(
                "rms_norm needs x as [tokens, hidden], each row and the weight contiguous"
            )
        rows, n = x.shape
        out = torch.empty(rows, n)
        self._norm(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), rows, n, eps)
        return out

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotates x ([tokens, heads, dim], each token's heads contiguous) in place by cos and
        sin ([tokens, 1, dim] or [tokens, dim], contiguous), as `rotary.rotate` does."""
        tokens, heads, dim = x.shape
        native.require_fp32_cpu("cpu_ops", x, cos, sin)
        if x.stride(2) != 1 or x.stride(1) != dim or dim % 2:
            raise ValueError("rope_ needs x as [tokens, heads, dim] with heads contiguous")
        if (sin.shape != cos.shape or cos.numel() != tokens * dim
                or not (cos.is_contiguous() and sin.is_contiguous())):  # fmt: skip
            raise ValueError(f"rope_ needs cos and sin of {tokens} x {dim}, contiguous")
        self._rope(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), tokens, heads, dim)

    def kv_write(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """k_cache[slots] = k and v_cache[slots] = v (k, v: [tokens, kv_heads, dim], each
        token's heads contiguous; the caches [slots, kv_heads, dim], contiguous)."""
        native.require_fp32_cpu("cpu_ops", k, v, k_cache, v_cache)
        tokens, heads, dim = k.shape
        width = heads * dim
        if v.shape != k.shape or k.stride()[1:] != (dim, 1) or v.stride()[1:] != (dim, 1):
            raise ValueError("kv_write needs k and v as [tokens, kv_heads, dim], heads contiguous")
        cache = k_cache.shape
        if (v_cache.shape != cache or cache[1:] != k.shape[1:]
                or not (k_cache.is_contiguous() and v_cache.is_contiguous())):  # fmt: skip
            raise ValueError("kv_write needs two contiguous caches of [slots, kv_heads, dim]")
        if slots.dtype is not torch.int64 or slots.shape != (tokens,) or not slots.is_contiguous():
            raise ValueError(f"kv_write needs {tokens} int64 slots")
        rc = self._kv_write(
            k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(),
            v_cache.data_ptr(), slots.data_ptr(), tokens, width, k_cache.shape[0],
        )  # fmt: skip
        if rc != 0:
            raise ValueError(
                f"kv_write: a slot outside the cache's {k_cache.shape[0]}, nothing written"
            )


def load() -> CpuOps | None:
    """The compiled ops, building them first if this machine has no copy; None without a C
    compiler or when the build fails (logged)."""
    path = native.build(
        SOURCE, FLAGS, "RMSNorm, the rotary embedding and the cache write stay torch ops"
    )
    # PyDLL: each call keeps the GIL (microseconds; see cpu_ops.c)
    return None if path is None else CpuOps(ctypes.PyDLL(str(path)))
