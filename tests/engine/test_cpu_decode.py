"""The CPU paged-decode kernel (cpu_decode.c, built with the C compiler) against the reference
decode (gathered SDPA) on the same cache, and the engine that picks it by default on the CPU."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import (
    GREEDY,
    HFReference,
    assert_decode_matches_reference,
    assert_matches_hf,
    random_prompts,
    run_to_completion,
)

from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.layers import cpu_decode
from kvscale_engine.layers.attention import PagedAttention

KV_HEADS = 2
RAGGED = [1, 2, 15, 16, 17, 31, 32, 33, 70, 300]  # ends mid-block, on a block edge, one token


@pytest.fixture(scope="module")
def kernel() -> cpu_decode.Kernel:
    built = cpu_decode.load()
    assert built is not None, "the CPU decode kernel did not build (is a C compiler installed?)"
    return built


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_matches_reference_decode(kernel: cpu_decode.Kernel, block_size: int, group: int) -> None:
    _compare(kernel, RAGGED, block_size, group, 64, window=None)


@pytest.mark.parametrize("lens", [[1], [5, 1, 40], [7, 8, 9, 100]])
@pytest.mark.parametrize("window", [1, 7, 16])
def test_sliding_window_and_odd_head_dim(
    kernel: cpu_decode.Kernel, lens: list[int], window: int
) -> None:
    _compare(kernel, lens, 16, 3, 24, window=window)


@pytest.mark.parametrize("block_size", [16, 32, 64])
@pytest.mark.parametrize("window", [None, 1, 7, 20, 33])
def test_wide_heads_match_with_windows_and_block_sizes(
    kernel: cpu_decode.Kernel, block_size: int, window: int | None
) -> None:
    """head_dim 64 with 4 query heads per KV head: the shape the AVX-512 path takes, rows
    scored sixteen at a time (a window starting mid-row-group, blocks wider than sixteen)."""
    _compare(kernel, [1, 5, 16, 17, 40, 100, 129], block_size, 4, 64, window=window)


@pytest.mark.parametrize(("group", "head_dim"), [(8, 64), (8, 128), (4, 128), (1, 128)])
def test_every_compiled_shape_matches(kernel: cpu_decode.Kernel, group: int, head_dim: int) -> None:
    _compare(kernel, RAGGED, 16, group, head_dim, window=None)


@pytest.mark.parametrize("lens", [[300], [40, 300, 7], [1, 5, 16, 17, 40, 100, 129, 300]])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_task_per_sequence_or_per_kv_head_matches(
    kernel: cpu_decode.Kernel, lens: list[int], group: int, threads: int
) -> None:
    """Under two sequences per thread the wide path makes a task of each (sequence, KV head);
    from two on, a task of each sequence, every KV head's rows of a block in turn. Both give the
    reference decode, with the threads they were given."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _compare(kernel, lens, 16, group, 64, window=None)
        _compare(kernel, lens, 32, group, 128, window=20)
    finally:
        torch.set_num_threads(before)


def test_an_avx512_cpu_gets_the_wide_path(kernel: cpu_decode.Kernel) -> None:
    flags = next(
        (ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), ""
    )
    assert kernel.lanes == (16 if " avx512f" in flags else 1)


def test_loading_leaves_the_process_float_mode_alone(kernel: cpu_decode.Kernel) -> None:
    """Built with -ffast-math but linked without it: flush-to-zero stays off for torch."""
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    assert (tiny * 1.0).item() > 0.0


def test_built_once_per_source_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCALE_KERNEL_CACHE", str(tmp_path))
    (tmp_path / "cpu_decode-0123456789abcdef.so").write_bytes(b"an older source's build")
    assert cpu_decode.load() is not None
    built = list(tmp_path.glob("cpu_decode-*.so"))  # and the older one is gone
    assert len(built) == 1 and not list(tmp_path.glob("tmp*")), list(tmp_path.iterdir())
    stamp = built[0].stat().st_mtime_ns
    assert cpu_decode.load() is not None
    assert built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_without_a_compiler_the_engine_keeps_the_reference_decode(
    no_compiler: None, make_engine: Callable[..., LLMEngine]
) -> None:
    assert cpu_decode.load() is None
    assert make_engine().model_runner.decode_attention == "reference"
    with pytest.raises(RuntimeError, match="could not be built"):
        make_engine(decode_attention="cpu")


def test_cpu_kernel_needs_fp32_on_the_cpu(make_engine: Callable[..., LLMEngine]) -> None:
    with pytest.raises(ValueError, match="needs fp32 on the CPU"):
        make_engine(decode_attention="cpu", dtype="bfloat16")
    assert make_engine(dtype="bfloat16").model_runner.decode_attention == "reference"


def test_bad_inputs_are_refused_not_read(kernel: cpu_decode.Kernel) -> None:
    q = torch.randn(1, 4, 64)
    cache = torch.randn(32, 2, 64)
    tables, lens = torch.zeros(1, 2, dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(ValueError, match="takes fp32 CPU tensors"):
        kernel(q.half(), cache, cache, tables, lens, scale=0.1, block_size=16)
    with pytest.raises(ValueError, match="in place"):
        kernel(q, cache.transpose(0, 1), cache, tables, lens, scale=0.1, block_size=16)
    with pytest.raises(ValueError, match="beyond its buffers"):
        kernel(torch.randn(1, 34, 64), cache, cache, tables, lens, scale=0.1, block_size=16)


def test_engine_picks_the_kernel_on_the_cpu_and_matches_hf(
    make_engine: Callable[..., LLMEngine], hf_llama: HFReference
) -> None:
    prompts = random_prompts(6, (1, 40), seed=5)
    engine = make_engine(block_size=16)
    assert engine.model_runner.decode_attention == "cpu"
    assert isinstance(_decode_fn(engine).func, cpu_decode.Kernel)
    finals = run_to_completion(engine, prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)


def _decode_fn(engine: LLMEngine) -> functools.partial[torch.Tensor]:
    attn = next(m for m in engine.model_runner.model.modules() if isinstance(m, PagedAttention))
    assert isinstance(attn.decode_fn, functools.partial)
    return attn.decode_fn


def _compare(
    kernel: cpu_decode.Kernel,
    lens: list[int],
    block_size: int,
    group: int,
    head_dim: int,
    window: int | None,
) -> None:
    assert_decode_matches_reference(kernel, lens, block_size, group, head_dim, window)
