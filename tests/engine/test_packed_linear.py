"""oneDNN-packed linears (fp32 on the CPU), one at a time and fused over a shared input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.layers.packed_linear import SMALL_ROWS, PackedLinear
from kvscale_engine.models.llama import MLP, Attention

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_packed_matches_linear(rows: int) -> None:
    torch.manual_seed(rows)
    linear = nn.Linear(48, 80, bias=True)
    x = torch.randn(2, rows, 48)
    torch.testing.assert_close(PackedLinear(linear)(x), linear(x), **TOL)


@pytest.mark.parametrize("small_batch", [False, True])
def test_packed_takes_an_empty_batch(small_batch: bool) -> None:
    out = PackedLinear(nn.Linear(8, 4), small_batch)(torch.empty(0, 8))
    assert out.shape == (0, 4)


@pytest.mark.parametrize("rows", [1, 2, SMALL_ROWS, SMALL_ROWS + 1, 64])
def test_small_batches_multiply_by_the_checkpoint_layout(rows: int) -> None:
    """Up to SMALL_ROWS rows go through F.linear over the weight as loaded (the same sums as
    nn.Linear's, bit for bit); more rows through oneDNN's blocked copy (equal to rounding)."""
    torch.manual_seed(rows)
    linear = nn.Linear(96, 160, bias=True)
    x = torch.randn(rows, 96)
    packed = PackedLinear(linear, small_batch=True)
    assert packed.plain is not None and torch.equal(packed.plain, linear.weight)
    got = packed(x)
    if rows <= SMALL_ROWS:
        assert torch.equal(got, linear(x))
    else:
        torch.testing.assert_close(got, linear(x), **TOL)
    torch.testing.assert_close(PackedLinear(linear)(x), got, **TOL)


@pytest.mark.parametrize("biases", [(False, False, False), (True, True, True), (True, False, True)])
def test_fused_matches_the_linears_side_by_side(biases: tuple[bool, bool, bool]) -> None:
    torch.manual_seed(1)
    linears = [nn.Linear(32, n, bias=b) for n, b in zip((64, 16, 16), biases, strict=True)]
    x = torch.randn(5, 32)
    fused = PackedLinear.fused(linears)
    assert (fused.in_features, fused.out_features) == (32, 96)
    expected = torch.cat([lin(x) for lin in linears], dim=-1)
    torch.testing.assert_close(fused(x), expected, **TOL)


def test_cpu_fp32_engine_runs_one_gemm_for_qkv_and_one_for_gate_up(
    make_engine: Callable[..., LLMEngine],
) -> None:
    engine = make_engine()
    model = engine.model_runner.model
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    mlps = [m for m in model.modules() if isinstance(m, MLP)]
    assert attns and mlps
    for a in attns:
        assert isinstance(a.qkv_proj, PackedLinear) and not hasattr(a, "q_proj")
        assert a.qkv_proj.out_features == (a.heads + 2 * a.kv_heads) * a.head_dim
    for m in mlps:
        assert isinstance(m.gate_up_proj, PackedLinear) and not hasattr(m, "up_proj")
    assert not [m for m in model.modules() if isinstance(m, nn.Linear)]  # all packed


def test_other_dtypes_keep_the_checkpoint_layout(make_engine: Callable[..., LLMEngine]) -> None:
    model = make_engine(dtype="bfloat16").model_runner.model
    attn = next(m for m in model.modules() if isinstance(m, Attention))
    assert attn.qkv_proj is None and isinstance(attn.q_proj, nn.Linear)


def test_the_engine_keeps_the_small_batch_layout_unless_told_not_to(
    make_engine: Callable[..., LLMEngine],
) -> None:
    """Both copies are weights the memory budget counts (the second the C kernel's panels, or
    the checkpoint's layout without it); --no-small-batch-weights keeps one."""
    sizes = {}
    for small in (True, False):
        model = make_engine(small_batch_weights=small).model_runner.model
        packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
        second = [m.plain if m.panels is None else m.panels for m in packed]
        assert packed and all((copy is not None) == small for copy in second)
        assert small or all(m.gemm is None for m in packed)
        sizes[small] = sum(p.numel() for p in model.parameters())
    assert sizes[True] - sizes[False] == sum(m.in_features * m.out_features for m in packed)
