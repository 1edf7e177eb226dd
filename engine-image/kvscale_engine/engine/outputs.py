"""What the engine hands back: one RequestOutput per request per step, and EngineStats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvscale_engine.engine.sequence import FinishReason


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    output_token_ids: list[int]
    delta_text: str
    text: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    first_scheduled_time: float | None


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_total_blocks: int
    num_free_blocks: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int
    computed_tokens: int  # token positions run through the model, recomputation included
    block_size: int
    kv_allocated_slots: int
    kv_used_slots: int
    preemptions_by_class: Mapping[str, int] = field(default_factory=dict)  # by victim class
    waiting_by_class: Mapping[str, int] = field(default_factory=dict)  # sequences waiting

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pool held by requests (0..1); cached free blocks count as free."""
        if self.num_total_blocks == 0:
            return 0.0
        return (self.num_total_blocks - self.num_free_blocks) / self.num_total_blocks

    @property
    def kv_waste_slots(self) -> int:
        """Allocated but unused token slots (internal fragmentation of the last blocks)."""
        return self.kv_allocated_slots - self.kv_used_slots

    @property
    def kv_waste_fraction(self) -> float:
        if self.kv_allocated_slots == 0:
            return 0.0
        return self.kv_waste_slots / self.kv_allocated_slots

    @property
    def prefix_cache_hit_rate(self) -> float:
        if self.prefix_cache_queries == 0:
            return 0.0
        return self.prefix_cache_hits / self.prefix_cache_queries
