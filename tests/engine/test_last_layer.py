"""The last layer computes only the rows that sample, and that changes no output and no cache."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from engine_helpers import GREEDY, HFReference, assert_matches_hf, random_prompts, run_to_completion

from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.engine.llm_engine import LLMEngine
from kvscale_engine.layers.attention import SeqSpan, build_metadata

MakeEngine = Callable[..., LLMEngine]
BLOCK = 16
# (first position of the new tokens, new tokens, samples): two decodes, a whole prompt, a chunk
# after a cached prefix that does not finish its prompt, a chunk that finishes one
STEP = [(40, 1, True), (70, 1, True), (0, 50, True), (20, 30, False), (30, 25, True)]


@pytest.mark.parametrize("decode_attention", ["reference", "cpu"])
@pytest.mark.parametrize("window", [None, 24])
def test_the_sampling_rows_alone_get_the_same_output_and_cache(
    decode_attention: str, window: int | None, tmp_path: Path, make_engine: MakeEngine
) -> None:
    arch = {"arch": "mistral", "sliding_window": window} if window else {"arch": "llama"}
    engine = make_engine(
        write_tiny_checkpoint(tmp_path, seed=4, **arch),
        device="cpu",
        decode_attention=decode_attention,
    )
    runner = engine.model_runner
    assert runner.paged_decode == (decode_attention == "cpu")
    torch.manual_seed(0)
    spans, next_block = [], 0
    for start, n, _ in STEP:
        blocks = -(-(start + n) // BLOCK)
        spans.append(SeqSpan(start, n, list(range(next_block + blocks - 1, next_block - 1, -1))))
        next_block += blocks  # each sequence's blocks, in reverse: tables are not identity maps
    ids = torch.randint(0, runner.model_cfg.vocab_size, (sum(n for _, n, _ in STEP),))
    positions = torch.cat([torch.arange(s.start, s.end) for s in spans])
    outputs = [i for i, (_, _, samples) in enumerate(STEP) if samples]
    for k, v in runner.kv_caches:  # the cached prefixes and earlier tokens: random K/V
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]

    def forward(outputs: list[int] | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        caches = [(k.clone(), v.clone()) for k, v in before]
        meta = build_metadata(
            spans,
            BLOCK,
            window,
            torch.device("cpu"),
            paged_decode=runner.paged_decode,
            outputs=outputs,
        )
        assert (meta.last_layer is not None) == (outputs is not None)
        with torch.inference_mode():
            hidden = runner.model(ids, positions, caches, meta)
        return hidden, [t for pair in caches for t in pair]

    every, every_cache = forward(None)
    kept, kept_cache = forward(outputs)
    ends = torch.cumsum(torch.tensor([n for _, n, _ in STEP]), 0) - 1
    assert kept.shape == (len(outputs), every.shape[1])
    torch.testing.assert_close(kept, every[ends[outputs]], atol=2e-5, rtol=1e-5)
    for a, b in zip(kept_cache, every_cache, strict=True):  # every row's K/V, the last layer's too
        assert torch.equal(a, b)


def test_a_step_where_every_row_samples_keeps_them_all() -> None:
    spans = [SeqSpan(9, 1, [0]), SeqSpan(0, 1, [1])]  # a decode, a one-token prompt
    meta = build_metadata(spans, BLOCK, None, torch.device("cpu"), outputs=[0, 1])
    assert meta.last_layer is None
    meta = build_metadata(spans, BLOCK, None, torch.device("cpu"), outputs=[1])
    assert meta.last_layer is not None and meta.last_layer.rows.tolist() == [1]


def test_slot_mapping_is_each_rows_cache_slot_in_row_order() -> None:
    # decodes over scattered blocks, then a prompt and a chunk that crosses a block boundary
    spans = [SeqSpan(17, 1, [5, 9]), SeqSpan(3, 1, [2]), SeqSpan(0, 3, [7]), SeqSpan(14, 4, [1, 4])]
    meta = build_metadata(spans, BLOCK, None, torch.device("cpu"))
    assert meta.slot_mapping.tolist() == [
        9 * BLOCK + 1, 2 * BLOCK + 3,  # decodes: position 17 is block 1's row 1; 3, block 0's
        7 * BLOCK, 7 * BLOCK + 1, 7 * BLOCK + 2,
        1 * BLOCK + 14, 1 * BLOCK + 15, 4 * BLOCK, 4 * BLOCK + 1,
    ]  # fmt: skip
    assert meta.num_decodes == 2 and len(meta.prefills) == 2
    with pytest.raises(ValueError, match="decodes"):  # the runner sorts them first
        build_metadata([spans[2], spans[0]], BLOCK, None, torch.device("cpu"))


def test_long_prompts_in_small_chunks_still_match_hf(
    make_engine: MakeEngine, hf_llama: HFReference
) -> None:
    prompts = random_prompts(6, (40, 200), seed=21)
    engine = make_engine(max_num_batched_tokens=48)  # most steps hold a chunk that does not sample
    finals = run_to_completion(engine, prompts)
    assert_matches_hf(hf_llama, prompts, finals, GREEDY.max_tokens)
