"""A linear layer for up to `MAX_ROWS` rows on the CPU (`cpu_gemm.c`), via ctypes.

A decode step multiplies one row per sequence by every weight. torch takes MKL at one row, which
reads the weights at memory speed, and oneDNN's blocked GEMM from four rows on, which does not:
the benchmark model's four GEMMs over its 8 layers (96 MB, one thread, AVX-512) took 3.4 ms at 1
row but 5.3 at 4, 9.0 at 8 and 15.6 at 32. This kernel reads a weight packed in panels of 16
output columns once per 16 rows, asking for its lines ahead: 3.4 ms at 4 and 3.6 at 8 rows, 10.5
at 32, 15.8 against 18.8 at 48; even at 64 (22.2 / 22.9) and slower beyond (42.2 / 38.0 at 128),
so PackedLinear takes it up to 48 rows and oneDNN's above.

Built once per machine by `native.py` for this CPU; `load()` returns None without a C compiler or
without AVX-512 (the kernel is written for its 16-float vectors), and PackedLinear keeps torch's.
The call releases the GIL, as torch's GEMMs do.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvscale_engine.layers import native

SOURCE = Path(__file__).with_suffix(".c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-std=c11")
PANEL = 16  # output columns a panel holds, as cpu_gemm.c
MAX_ROWS = 48  # PackedLinear's rows up to which this beats oneDNN (module docstring)
_i64, _int, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p


class Gemm:
    """The loaded library's `kvscale_gemm`: y = x W^T (+ bias), W packed by `pack`."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._fn = lib.kvscale_gemm
        self._fn.argtypes = [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _int, _int, _int]
        self._fn.restype = ctypes.c_int

    @staticmethod
    def can_take(weight: torch.Tensor) -> bool:
        """A [out, in] fp32 CPU weight whose outputs fill whole panels."""
        return (
            weight.dim() == 2 and weight.shape[0] % PANEL == 0
            and weight.dtype is torch.float32 and weight.is_cpu
        )  # fmt: skip

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """[out, in] -> panels [out / 16, in, 16]: panel p holds outputs 16p..16p+15, k-major."""
        if not Gemm.can_take(weight):
            raise ValueError(
                f"cpu_gemm packs fp32 CPU weights of [out, in] with out a multiple of {PANEL}, "
                f"not {tuple(weight.shape)} {weight.dtype} on {weight.device}"
            )
        out, inp = weight.shape
        return weight.detach().reshape(out // PANEL, PANEL, inp).transpose(1, 2).contiguous()

    def __call__(
        self, x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [rows, in] (each row contiguous) times the packed weight: [rows, out]."""
        groups, inp, lanes = panels.shape
        out = groups * PANEL
        native.require_fp32_cpu("cpu_gemm", x, panels, *(() if bias is None else (bias,)))
        if x.dim() != 2 or x.shape[1] != inp or x.stride(1) != 1:
            raise ValueError(f"cpu_gemm needs x as [rows, {inp}], each row contiguous")
        if lanes != PANEL or not panels.is_contiguous():
            raise ValueError("cpu_gemm needs the weight as Gemm.pack returns it")
        if bias is not None and (bias.shape != (out,) or not bias.is_contiguous()):
            raise ValueError(f"cpu_gemm needs a contiguous bias of {out}")
        rows = x.shape[0]
        y = torch.empty(rows, out)
        rc = self._fn(
            x.data_ptr(), x.stride(0), panels.data_ptr(),
            None if bias is None else bias.data_ptr(), y.data_ptr(), out, rows, out, inp,
        )  # fmt: skip
        if rc != 0:
            raise ValueError(f"cpu_gemm refused {rows} x {inp} by {out}")
        return y


def load() -> Gemm | None:
    """The compiled kernel, building it first if this machine has no copy; None without a C
    compiler, when the build fails (logged) or on a CPU without AVX-512."""
    path = native.build(SOURCE, FLAGS, "linears of a few rows stay torch's GEMMs")
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))  # releases the GIL during a call
    lib.kvscale_gemm_lanes.restype = ctypes.c_int
    return Gemm(lib) if lib.kvscale_gemm_lanes() == PANEL else None
