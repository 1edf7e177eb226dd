"""The Triton paged-decode kernel against the reference decode (gathered SDPA) on the same cache.

On the CPU the kernel runs under Triton's interpreter, which must be switched on before the
kernel module is imported (the kernel is defined at import); KVSCALE_TEST_DEVICE=cuda runs it
compiled on the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable

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

DEVICE = torch.device(os.environ.get("KVSCALE_TEST_DEVICE", "cpu"))
if DEVICE.type == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from kvscale_engine.engine.llm_engine import LLMEngine  # noqa: E402
from kvscale_engine.layers import paged_decode as kernel  # noqa: E402

HEAD_DIM = 32
KV_HEADS = 2
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}
RAGGED = [1, 2, 15, 16, 17, 31, 32, 33, 70]  # ends mid-block, on a block edge, a single token


def test_kernel_is_interpreted_on_cpu_and_compiled_on_cuda() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = isinstance(kernel._paged_decode_kernel, InterpretedFunction)
    assert interpreted == (DEVICE.type == "cpu")


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_matches_reference_decode(block_size: int, group: int) -> None:
    _compare(RAGGED, block_size, group, HEAD_DIM, torch.float32, window=None)


@pytest.mark.parametrize("lens", [[1], [5, 1, 40]])
def test_sliding_window_and_odd_head_dim(lens: list[int]) -> None:
    _compare(lens, 16, 3, 24, torch.float32, window=7)


def test_half_precision() -> None:
    _compare(RAGGED, 16, 4, HEAD_DIM, torch.float16, window=None)


def _compare(
    lens: list[int],
    block_size: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    window: int | None,
) -> None:
    assert_decode_matches_reference(
        kernel.paged_decode, lens, block_size, group, head_dim, window, dtype, DEVICE,
        TOLERANCE[dtype], KV_HEADS,
    )  # fmt: skip


def test_engine_with_the_kernel_matches_hf(
    make_engine: Callable[..., LLMEngine], hf_llama: HFReference
) -> None:
    prompts = random_prompts(6, (1, 40), seed=5)
    engine = make_engine(decode_attention="triton", block_size=16)
    assert engine.model_runner.paged_decode
    finals = run_to_completion(engine, prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)
