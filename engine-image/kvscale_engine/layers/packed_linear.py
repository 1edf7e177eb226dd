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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.weight = nn.Parameter(packed, requires_grad=False)  # counted with the weights
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @classmethod
    def fused(cls, linears: Sequence[nn.Linear]) -> PackedLinear:
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
        return cls(whole)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0]:  # the model's [tokens, features]: no reshape each way
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")  # type: ignore[no-any-return]
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], self.out_features)
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            rows, self.weight, self.bias, "none", [], ""
        )
        return out.view(*x.shape[:-1], self.out_features)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    mkldnn: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
    return device.type == "cpu" and dtype == torch.float32 and mkldnn


def pack_linears(model: nn.Module) -> int:
    """Swap every nn.Linear below `model` for a PackedLinear; returns how many it swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    return swapped
