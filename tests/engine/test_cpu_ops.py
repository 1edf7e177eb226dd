"""The decoder's small ops in C (cpu_ops.c): RMSNorm, the rotary embedding and the KV cache write,
each against the torch code it stands in for, and the engine that installs them on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from engine_helpers import GREEDY, HFReference, assert_matches_hf, random_prompts, run_to_completion

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.layers import cpu_ops
from kvscale_engine.layers.attention import PagedAttention
from kvscale_engine.layers.rotary import RotaryEmbedding, rotate
from kvscale_engine.models.llama import Attention, RMSNorm


@pytest.fixture(scope="module")
def ops() -> cpu_ops.CpuOps:
    built = cpu_ops.load()
    assert built is not None, "cpu_ops.c did not build (is a C compiler installed?)"
    return built


@pytest.mark.parametrize("tokens", [1, 3, 17, 300])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(8, 2, 64), (4, 4, 128), (6, 1, 32)])
def test_rope_is_bit_for_bit_torchs_on_the_fused_projections(
    ops: cpu_ops.CpuOps, tokens: int, heads: int, kv_heads: int, dim: int
) -> None:
    """q and k as the model has them: views of one qkv output, rows strided by its width."""
    g = torch.Generator().manual_seed(tokens * dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g) * 4
    q, k, _ = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q, k = q.view(-1, heads, dim), k.view(-1, kv_heads, dim)
    rotary = RotaryEmbedding(dim, 10000.0, 4096, {})
    rope = rotary.at(torch.randint(0, 4096, (tokens,), generator=g), torch.float32)
    want_q, want_k = rotate(rope, q, k)
    v_before = qkv[:, (heads + kv_heads) * dim :].clone()
    for t in (q, k):
        ops.rope_(t, *rope)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * dim :], v_before)  # v is left alone


@pytest.mark.parametrize("rows", [1, 5, 64, 257])
@pytest.mark.parametrize("hidden", [512, 100, 7])  # whole lanes, a ragged tail, under a lane
def test_rms_norm_matches_torchs_to_rounding(ops: cpu_ops.CpuOps, rows: int, hidden: int) -> None:
    g = torch.Generator().manual_seed(rows + hidden)
    norm = RMSNorm(hidden, 1e-6)
    norm.weight.data = torch.randn(hidden, generator=g)
    wide = torch.randn(rows, hidden + 9, generator=g) * 3
    x = wide[:, 3 : 3 + hidden]  # strided rows
    got = ops.rms_norm(x, norm.weight, norm.eps)
    want = norm(x)
    assert got.is_contiguous() and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)  # only the sum's order differs


def test_kv_write_is_index_copy(ops: cpu_ops.CpuOps) -> None:
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(5, 2 * 2 * 16, generator=g)
    k, v = (t.view(-1, 2, 16) for t in kv.chunk(2, dim=-1))
    slots = torch.tensor([7, 0, 31, 8, 15])
    got_k, got_v = torch.zeros(32, 2, 16), torch.zeros(32, 2, 16)
    ops.kv_write(k, v, got_k, got_v, slots)
    want_k, want_v = torch.zeros(32, 2, 16), torch.zeros(32, 2, 16)
    want_k.index_copy_(0, slots, k)
    want_v.index_copy_(0, slots, v)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_a_slot_outside_the_cache_writes_nothing(ops: cpu_ops.CpuOps) -> None:
    k = v = torch.ones(3, 2, 16)
    k_cache, v_cache = torch.zeros(32, 2, 16), torch.zeros(32, 2, 16)
    for bad in (32, -1):
        with pytest.raises(ValueError, match="outside the cache"):
            ops.kv_write(k, v, k_cache, v_cache, torch.tensor([1, 2, bad]))
    assert not k_cache.any() and not v_cache.any()


def test_bad_inputs_are_refused_not_read(ops: cpu_ops.CpuOps) -> None:
    x, w = torch.randn(2, 64), torch.ones(64)
    with pytest.raises(ValueError, match="fp32 CPU tensors"):
        ops.rms_norm(x.half(), w, 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        ops.rms_norm(x.t(), torch.ones(2), 1e-6)
    cos = torch.ones(2, 1, 64)
    with pytest.raises(ValueError, match="heads contiguous"):
        ops.rope_(torch.randn(2, 64, 4).transpose(1, 2), cos, cos)
    with pytest.raises(ValueError, match="cos and sin of 2 x 64"):
        ops.rope_(torch.randn(2, 4, 64), torch.ones(3, 1, 64), cos)
    k = torch.randn(3, 2, 16)
    cache = torch.zeros(32, 2, 16)
    with pytest.raises(ValueError, match="3 int64 slots"):
        ops.kv_write(k, k, cache, cache, torch.tensor([1, 2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous caches"):
        ops.kv_write(k, k, torch.zeros(32, 4, 8), cache, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="contiguous caches"):  # V's cache shorter than K's
        ops.kv_write(k, k, cache, torch.zeros(8, 2, 16), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="cos and sin of 2 x 64"):
        ops.rope_(torch.randn(2, 4, 64), cos, torch.ones(1, 1, 64))


def test_the_engine_runs_them_on_the_cpu_and_matches_hf(
    make_engine: Callable[..., LLMEngine], hf_llama: HFReference
) -> None:
    prompts = random_prompts(6, (1, 40), seed=6)
    engine = make_engine(block_size=16)
    modules = [
        m
        for m in engine.model_runner.model.modules()
        if isinstance(m, (RMSNorm, Attention, PagedAttention))
    ]
    assert modules and all(isinstance(m.cpu_ops, cpu_ops.CpuOps) for m in modules)
    finals = run_to_completion(engine, prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def test_without_a_compiler_the_model_keeps_its_torch_ops(
    no_compiler: None, make_engine: Callable[..., LLMEngine], hf_llama: HFReference
) -> None:
    assert cpu_ops.load() is None
    engine = make_engine()
    norms = [m for m in engine.model_runner.model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.cpu_ops is None for m in norms)
    prompts = random_prompts(3, (1, 30), seed=7)
    assert_matches_hf(hf_llama, prompts, run_to_completion(engine, prompts), GREEDY.max_tokens)


def test_not_installed_beyond_fp32(make_engine: Callable[..., LLMEngine]) -> None:
    engine = make_engine(dtype="bfloat16")
    norms = [m for m in engine.model_runner.model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.cpu_ops is None for m in norms)
