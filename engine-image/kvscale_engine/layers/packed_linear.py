"""Linear layers whose weights oneDNN has reordered once, for fp32 on the CPU.

`F.linear` on the CPU multiplies by the weight in its checkpoint layout at every step; oneDNN's
kernels read a blocked layout, so `_reorder_linear_weight` converts the weight once at load and
`_linear_pointwise` multiplies by it (the pair inductor's freezing pass emits, and what vLLM's CPU
backend does for its linears). On the 2-core bench machine that made a decode step's GEMMs 1.3x
faster at 1 sequence and 2-3x at 8 to 128 (bench/engine_vs_vllm.py). Results agree with
`F.linear` to fp32 rounding (the sums run in another order).

Linears that read the same input (q/k/v, gate/up) can be packed as one (`PackedLinear.fused`):
one GEMM instead of three or two, its outputs side by side. On the bench model that took a
decode step from about 5.6 to 4.9 ms at 1 sequence and 18.7 to 17.9 ms at 32 (three alternating
rounds, offline), since a small GEMM's fixed cost counts at low batch.

At one to three rows, though, oneDNN's blocked GEMM is slower than `F.linear` over the weight in
the checkpoint's layout (MKL): a layer's four GEMMs of the benchmark's model, 1 thread, 8
layers' weights in turn, 752 vs 603 us at 1 row, 822 vs 610 at 2, 750 vs 637 at 3, but 724 vs
1,041 at 4 and 1.4-1.6x the other way at 16. With `small_batch` a PackedLinear keeps that layout
too and takes it for up to SMALL_ROWS rows: a decode step at 1-3 in flight 7-11% shorter
(alternating step by step), for twice the weight memory (`--no-small-batch-weights` keeps one).

Given the C kernel (`cpu_gemm.py`: a CPU with AVX-512 and a C compiler), that second copy is the
kernel's panels instead, and it takes up to `cpu_gemm.MAX_ROWS` (48) rows: oneDNN read the
weights at a third of memory speed from four rows on (the four GEMMs of 8 layers 9.0 ms at 8
rows, the kernel 3.6; 15.6 and 10.5 at 32). Where the kernel is missing, the checkpoint layout
serves 1-3 rows as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kvscale_engine.layers import cpu_gemm

SMALL_ROWS = 3  # up to this many rows multiply by the weight in the checkpoint's layout


class PackedLinear(nn.Module):
    def __init__(
        self, linear: nn.Linear, small_batch: bool = False, gemm: cpu_gemm.Gemm | None = None
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        plain = linear.weight.detach().contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(plain, None)
        self.weight = nn.Parameter(packed, requires_grad=False)  # counted with the weights
        # small batches (a second copy, counted too): the kernel's panels when `gemm` can take
        # this weight, else the checkpoint's layout; None without small_batch
        self.gemm = gemm if small_batch and gemm is not None and gemm.can_take(plain) else None
        self.small_rows = cpu_gemm.MAX_ROWS if self.gemm is not None else SMALL_ROWS
        self.panels = self.plain = None
        if self.gemm is not None:
            self.panels = nn.Parameter(self.gemm.pack(plain), requires_grad=False)
        elif small_batch:
            self.plain = nn.Parameter(plain, requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def fused(
        cls,
        linears: Sequence[nn.Linear],
        small_batch: bool = False,
        gemm: cpu_gemm.Gemm | None = None,
    ) -> PackedLinear:
        """One packed linear for `linears` that read the same input; outputs in their order (a
        missing bias among biased ones counts as zeros)."""
        out = sum(lin.out_features for lin in linears)
        biased = any(lin.bias is not None for lin in linears)
        whole = nn.Linear(linears[0].in_features, out, bias=biased)
        with torch.no_grad():
            whole.weight.copy_(torch.cat([lin.weight for lin in linears]))
            if whole.bias is not None:
                parts: list[torch.Tensor] = [
                    torch.zeros(lin.out_features) if lin.bias is None else lin.bias
                    for lin in linears
                ]
                whole.bias.copy_(torch.cat(parts))
        return cls(whole, small_batch, gemm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # the model's are 2-D
        n = rows.shape[0]
        if n == 0:
            out = x.new_empty(0, self.out_features)
        elif n <= self.small_rows and self.gemm is not None and self.panels is not None:
            out = self.gemm(rows, self.panels, self.bias)
        elif n <= SMALL_ROWS and self.plain is not None:
            out = F.linear(rows, self.plain, self.bias)
        else:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.weight, self.bias, "none", [], "")
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    mkldnn: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return device.type == "cpu" and dtype == torch.float32 and mkldnn


def pack_linears(
    model: nn.Module, small_batch: bool = False, gemm: cpu_gemm.Gemm | None = None
) -> int:
    """Swap every nn.Linear below `model` for a PackedLinear; returns how many it swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child, small_batch, gemm))
                swapped += 1
    return swapped
