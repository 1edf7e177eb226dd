"""KV budget arithmetic checked against what engines logged for known models (within 5%)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvscale.sim.profile import load_profile
from kvscale.sim.sizing import GIB, Budget, ModelShape, SizingError, recommend_limits


def llama3_8b(gpu_gib: float, fraction: float, batched: int, seqs: int) -> Budget:
    return Budget(
        ModelShape.load("llama-3-8b"), int(gpu_gib * GIB), 1, fraction, 2, 2, 16, batched, seqs
    )


def test_llama3_8b_shape() -> None:
    m = ModelShape.load("llama-3-8b")
    assert m.params == 8_030_261_248  # Meta-Llama-3-8B's published parameter count
    assert m.kv_bytes_per_token(2) == 131_072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    # vLLM logged "Loading model weights took 14.9595 GB" (GiB; it also holds RoPE caches)
    assert llama3_8b(80, 0.9, 8192, 256).weight_bytes / GIB == pytest.approx(14.9595, abs=0.01)


def test_kv_blocks_match_vllm_for_llama3_8b_on_an_80gb_gpu() -> None:
    # vLLM 0.4.1 (NVIDIA NIM 1.0.0 for llama3-8b-instruct, bf16, max_seq_len 8192, the default
    # gpu_memory_utilization 0.9) logged "# GPU blocks: 27793, # CPU blocks: 2048" on an
    # 80 GB GPU (docs.nvidia.com, "Elastic NIM" example start-up log). An 80 GB A100/H100
    # reports 79.15 GiB to CUDA; vLLM 0.4 profiles max(8192, 2048) batched tokens, 256 sequences.
    b = llama3_8b(79.15, 0.9, 8192, 256)
    assert b.blocks == pytest.approx(27_793, rel=0.05)
    assert b.max_concurrency(8192) == pytest.approx(27_793 * 16 / 8192, rel=0.05)


def test_kv_tokens_match_the_kvscale_engine_on_an_h200() -> None:
    # issue 10: the kvscale engine allocated 901,008 KV tokens (56,313 blocks of 16) for the
    # dummy Llama-3-8B in bf16 at memory fraction 0.9 on one H200 (139.8 GiB to CUDA)
    b = llama3_8b(139.8, 0.9, 2048, 256)
    assert b.kv_tokens == pytest.approx(901_008, rel=0.05)
    assert b.blocks == pytest.approx(56_313, rel=0.05)


def test_more_memory_or_fraction_never_means_fewer_blocks() -> None:
    small = llama3_8b(79.15, 0.8, 8192, 256).blocks
    assert llama3_8b(79.15, 0.9, 8192, 256).blocks > small
    assert llama3_8b(139.8, 0.8, 8192, 256).blocks > small
    assert llama3_8b(16.0, 0.9, 8192, 256).blocks == 0  # the weights do not even fit


def test_config_json_and_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "vocab_size": 151936,
                "hidden_size": 896,
                "intermediate_size": 4864,
                "num_hidden_layers": 24,
                "num_attention_heads": 14,
                "num_key_value_heads": 2,
                "tie_word_embeddings": True,
            }
        )
    )
    m = ModelShape.load(str(tmp_path))
    assert m.params == 494_032_768  # Qwen2-0.5B's published count
    with pytest.raises(SizingError, match="lacks"):
        ModelShape.from_config({"hidden_size": 1})
    with pytest.raises(SizingError, match="neither"):
        ModelShape.load("no-such-model")


def test_recommended_limits_keep_a_mixed_step_within_the_itl_slo() -> None:
    p = load_profile("h200-kvscale-eager")
    seqs, batched = recommend_limits(p.kv_tokens, 1500.0, p, 0.2)
    assert seqs % 8 == 0 and seqs <= p.kv_tokens / 1500
    assert batched >= seqs
    step = p.decode_step(np.array([float(seqs)]), np.array([1500.0]))[0]
    assert step + batched / p.prefill_rate(np.array([float(batched)]))[0] <= 0.8 * 0.2
    assert recommend_limits(900_000, 1500.0) == (600, 2048)  # no profile: KV only
