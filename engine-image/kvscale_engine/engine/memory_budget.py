"""How many KV blocks fit: device memory times a fraction, minus weights and activation peak.

This is the one place the thesis "weights are a floor, KV grows per token, headroom absorbs
bursts" becomes a number. No torch here; the model runner measures the inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscale_engine.config import ConfigError, EngineConfig
from kvscale_engine.model_config import ModelConfig


@dataclass(frozen=True)
class MemoryBudget:
    total_bytes: int
    memory_fraction: float
    weight_bytes: int
    activation_bytes: int
    block_bytes: int

    @property
    def kv_bytes(self) -> int:
        return (
            int(self.total_bytes * self.memory_fraction) - self.weight_bytes - self.activation_bytes
        )

    @property
    def num_blocks(self) -> int:
        return max(self.kv_bytes // self.block_bytes, 0)


def kv_block_bytes(model: ModelConfig, block_size: int, dtype_bytes: int) -> int:
    return model.kv_bytes_per_token * block_size * dtype_bytes


def plan_num_blocks(config: EngineConfig, budget: MemoryBudget) -> int:
    """Blocks to allocate: the override, else the budget capped at what the engine can use."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if budget.num_blocks < config.max_blocks_per_seq:
        raise ConfigError(
            f"KV budget of {budget.kv_bytes / 2**30:.2f} GiB holds {budget.num_blocks} blocks, "
            f"fewer than one max_model_len={config.max_model_len} sequence needs "
            f"({config.max_blocks_per_seq}); raise memory_fraction or lower max_model_len"
        )
    useful = config.max_num_seqs * config.max_blocks_per_seq
    return min(budget.num_blocks, useful)


def estimated_activation_bytes(model: ModelConfig, num_tokens: int, dtype_bytes: int) -> int:
    """Peak activations of one forward over `num_tokens` (used where no allocator can measure)."""
    per_token = (
        4 * model.hidden_size
        + 3 * model.intermediate_size
        + (model.num_attention_heads + 2 * model.num_key_value_heads) * model.head_dim
    )
    scores = model.num_attention_heads * num_tokens * num_tokens * 4
    return num_tokens * per_token * dtype_bytes + scores + model.vocab_size * 4 * 256
