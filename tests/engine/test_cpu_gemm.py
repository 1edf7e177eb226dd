"""The few-rows linear in C (cpu_gemm.c) against fp64 sums and torch's, and the engine that takes
it for its small batches on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from engine_helpers import GREEDY, HFReference, assert_matches_hf, random_prompts, run_to_completion
from torch import nn

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.layers import cpu_gemm
from kvscale_engine.layers.packed_linear import SMALL_ROWS, PackedLinear

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def gemm() -> cpu_gemm.Gemm:
    built = cpu_gemm.load()
    assert built is not None, "cpu_gemm.c did not build, or this CPU has no AVX-512"
    return built


def _want(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().T
    return (out if b is None else out + b.double()).float()


# one pass of 1-16 rows, passes of 16 and a remainder, the most PackedLinear sends it
@pytest.mark.parametrize("rows", [0, 1, 2, 5, 8, 15, 16, 17, 31, 33, 48])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_the_sums(gemm: cpu_gemm.Gemm, rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * 2 + bias)
    w = torch.randn(96, 200, generator=g)  # six panels; an inner size off any vector width
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(rows, 200, generator=g)
    got = gemm(x, gemm.pack(w), b)
    assert got.shape == (rows, 96)
    torch.testing.assert_close(got, _want(x, w, b), **TOL)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, w, b), **TOL)


def test_strided_rows_as_the_model_passes_them(gemm: cpu_gemm.Gemm) -> None:
    """A view of every other column block's rows (row stride wider than the row)."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(7, 300, generator=g)
    x = wide[:, 40:168]
    w = torch.randn(32, 128, generator=g)
    assert x.stride(0) == 300 and not x.is_contiguous()
    torch.testing.assert_close(gemm(x, gemm.pack(w)), _want(x, w, None), **TOL)


def test_pack_puts_sixteen_outputs_k_major_in_each_panel(gemm: cpu_gemm.Gemm) -> None:
    w = torch.arange(32 * 3, dtype=torch.float32).view(32, 3)
    panels = gemm.pack(w)
    assert panels.shape == (2, 3, 16)
    assert torch.equal(panels[1, 2], w[16:32, 2])  # panel 1, k = 2: outputs 16..31


def test_bad_inputs_are_refused(gemm: cpu_gemm.Gemm) -> None:
    w = torch.randn(32, 8)
    panels = gemm.pack(w)
    with pytest.raises(ValueError, match="out a multiple of 16"):
        gemm.pack(torch.randn(20, 8))
    with pytest.raises(ValueError, match="fp32 CPU"):
        gemm(torch.randn(2, 8, dtype=torch.float64), panels)
    with pytest.raises(ValueError, match=r"x as \[rows, 8\]"):
        gemm(torch.randn(2, 9), panels)
    with pytest.raises(ValueError, match="each row contiguous"):
        gemm(torch.randn(8, 2).T, panels)
    with pytest.raises(ValueError, match=r"as Gemm\.pack returns it"):
        gemm(torch.randn(2, 8), torch.randn(2, 16, 8).transpose(1, 2))
    with pytest.raises(ValueError, match="bias of 32"):
        gemm(torch.randn(2, 8), panels, torch.randn(31))


@pytest.mark.parametrize("rows", [1, SMALL_ROWS + 1, cpu_gemm.MAX_ROWS, cpu_gemm.MAX_ROWS + 1])
def test_packed_linear_takes_it_up_to_max_rows(gemm: cpu_gemm.Gemm, rows: int) -> None:
    """Up to MAX_ROWS rows through the kernel's panels (its sums exactly), more through oneDNN's
    blocked copy; both nn.Linear's to rounding. The panels replace the checkpoint-layout copy."""
    torch.manual_seed(rows)
    linear = nn.Linear(64, 48, bias=True)
    packed = PackedLinear(linear, small_batch=True, gemm=gemm)
    assert packed.plain is None and packed.panels is not None
    assert packed.small_rows == cpu_gemm.MAX_ROWS
    x = torch.randn(rows, 64)
    got = packed(x)
    kernel = gemm(x, packed.panels, packed.bias)
    assert torch.equal(got, kernel) == (rows <= cpu_gemm.MAX_ROWS)
    torch.testing.assert_close(got, linear(x), **TOL)


def test_a_weight_it_cannot_take_keeps_the_checkpoint_layout(gemm: cpu_gemm.Gemm) -> None:
    linear = nn.Linear(64, 40)  # 40 outputs: not whole panels
    packed = PackedLinear(linear, small_batch=True, gemm=gemm)
    assert packed.panels is None and packed.plain is not None
    assert packed.small_rows == SMALL_ROWS
    x = torch.randn(2, 64)
    assert torch.equal(packed(x), linear(x))


def test_the_engine_takes_it_for_small_batches_and_matches_hf(
    make_engine: Callable[..., LLMEngine], hf_llama: HFReference
) -> None:
    """Decodes of 1-8 sequences go through the kernel; outputs stay HF's token for token."""
    engine = make_engine(block_size=16, max_num_seqs=8)
    packed = [m for m in engine.model_runner.model.modules() if isinstance(m, PackedLinear)]
    assert packed and all(m.gemm is not None and m.panels is not None for m in packed)
    prompts = random_prompts(8, (1, 40), seed=11)
    assert_matches_hf(hf_llama, prompts, run_to_completion(engine, prompts), GREEDY.max_tokens)


def test_without_a_compiler_the_engine_keeps_torchs_gemms(
    no_compiler: None, make_engine: Callable[..., LLMEngine]
) -> None:
    assert cpu_gemm.load() is None
    packed = [m for m in make_engine().model_runner.model.modules() if isinstance(m, PackedLinear)]
    assert packed and all(m.gemm is None and m.plain is not None for m in packed)
