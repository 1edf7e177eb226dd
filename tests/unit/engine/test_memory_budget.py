"""The KV pool size: memory times fraction, minus weights and activations, in whole blocks."""

from __future__ import annotations

import pytest

from kvscale_engine.config import ConfigError, EngineConfig
from kvscale_engine.engine.memory_budget import MemoryBudget, kv_block_bytes, plan_num_blocks
from kvscale_engine.model_config import ModelConfig

GIB = 2**30


def test_llama_3_8b_block_size_in_bf16() -> None:
    model = ModelConfig.from_source("llama-3-8b")
    assert kv_block_bytes(model, 16, 2) == 2 * 32 * 8 * 128 * 16 * 2  # 2 MiB per block


def test_budget_subtracts_weights_and_activations() -> None:
    budget = MemoryBudget(80 * GIB, 0.9, 16 * GIB, 2 * GIB, 2 * 2**20)
    assert budget.kv_bytes == int(72 * GIB) - 18 * GIB
    assert budget.num_blocks == (54 * GIB) // (2 * 2**20)


def test_plan_caps_at_what_the_engine_can_use_and_honours_the_override() -> None:
    budget = MemoryBudget(80 * GIB, 0.9, 16 * GIB, 2 * GIB, 2 * 2**20)
    config = EngineConfig("dummy:llama-3-8b", max_model_len=1024, max_num_seqs=4)
    assert plan_num_blocks(config, budget) == 4 * 64
    override = EngineConfig("dummy:llama-3-8b", num_kv_blocks=7)
    assert plan_num_blocks(override, budget) == 7


def test_a_budget_too_small_for_one_sequence_is_a_config_error() -> None:
    budget = MemoryBudget(20 * GIB, 0.9, 16 * GIB, 2 * GIB, 2 * 2**20)
    with pytest.raises(ConfigError, match="memory_fraction"):
        plan_num_blocks(EngineConfig("dummy:llama-3-8b", max_model_len=8192), budget)


def test_model_config_parses_hf_fields() -> None:
    raw = {
        "model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "sliding_window": 4,
        "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 5.0},
    }  # fmt: skip
    cfg = ModelConfig.from_dict(raw)
    assert cfg.attention_bias and cfg.sliding_window is None  # qwen2 without use_sliding_window
    assert cfg.num_key_value_heads == 2 and cfg.head_dim == 4
    assert cfg.rope_theta == 5.0 and cfg.rope_scaling["rope_type"] == "yarn"
    with pytest.raises(ConfigError, match="model_type"):
        ModelConfig.from_dict({**raw, "model_type": "gpt2"})
