"""The only part of the engine that touches the device: KV cache, forward pass, sampling.

At start it loads the model, sizes the KV pool from the memory budget (device memory, weights, and
the activation peak measured over a profiling pass) and allocates one flat K and V tensor per
layer.
"""

from __future__ import annotations

import math

import torch

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.device_memory import measure_peak, total_bytes
from kvscale_engine.engine.loader import load_model
from kvscale_engine.engine.memory_budget import (
    MemoryBudget,
    estimated_activation_bytes,
    kv_block_bytes,
    plan_num_blocks,
)
from kvscale_engine.engine.scheduler import ScheduledBatch, ScheduledSeq
from kvscale_engine.layers.attention import BlockMaskFn, SeqSpan, build_metadata
from kvscale_engine.layers.sampler import SampleRequest, sample
from kvscale_engine.model_config import ModelConfig
from kvscale_engine.models.llama import KVCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, model_cfg: ModelConfig) -> None:
        self.config = config
        self.model_cfg = model_cfg
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model = load_model(config, model_cfg, self.device, self.dtype)
        self.block_mask_fn: BlockMaskFn | None = None
        if _use_flex(config, self.device):
            self._install_flex()
        self.budget: MemoryBudget | None = None
        if config.num_kv_blocks is None:
            self.budget = self._measure_budget()
        self.num_kv_blocks = (
            plan_num_blocks(config, self.budget) if self.budget else (config.num_kv_blocks or 0)
        )
        self.kv_caches = self._allocate_kv(self.num_kv_blocks)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int]:
        """One forward over the batch; a token for each sequence that samples, in batch order."""
        items = sorted(batch.seqs, key=lambda s: s.num_new_tokens != 1)  # decodes first
        input_ids, positions = self._inputs(items)
        spans = [SeqSpan(i.start, i.num_new_tokens, i.seq.block_table) for i in items]
        meta = build_metadata(
            spans,
            self.config.block_size,
            self.model_cfg.sliding_window,
            self.device,
            self.block_mask_fn,
        )
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        ends = torch.tensor([i.num_new_tokens for i in items]).cumsum(0) - 1
        sampling = [n for n, i in enumerate(items) if i.samples]
        logits = self.model.compute_logits(hidden[ends[sampling].to(self.device)]).float()
        requests = [
            SampleRequest(items[n].seq.params, items[n].seq.num_output_tokens) for n in sampling
        ]
        tokens = dict(
            zip(
                (id(items[n]) for n in sampling),
                sample(logits, requests, self.generator),
                strict=True,
            )
        )
        return [tokens[id(i)] for i in batch.seqs if i.samples]

    def _inputs(self, items: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = [t for i in items for t in i.seq.token_ids[i.start : i.end]]
        pos = [p for i in items for p in range(i.start, i.end)]
        return (
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.tensor(pos, dtype=torch.long, device=self.device),
        )

    def _allocate_kv(self, num_blocks: int) -> list[KVCache]:
        shape = (
            num_blocks * self.config.block_size,
            self.model_cfg.num_key_value_heads,
            self.model_cfg.head_dim,
        )
        return [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(self.model_cfg.num_hidden_layers)
        ]

    def _measure_budget(self) -> MemoryBudget:
        dtype_bytes = torch.empty(0, dtype=self.dtype).element_size()
        block_bytes = kv_block_bytes(self.model_cfg, self.config.block_size, dtype_bytes)
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        total = total_bytes(self.device)
        if self.device.type == "cpu":
            total += weights  # MemAvailable was read after the weights were loaded
        tokens = min(self.config.max_num_batched_tokens, self.config.max_model_len)
        activation = self._profile_activation_peak(tokens)
        if self.device.type == "cpu":  # peak RSS misses memory the allocator already held
            estimate = estimated_activation_bytes(self.model_cfg, tokens, dtype_bytes)
            activation = max(activation or 0, estimate)
        assert activation is not None
        return MemoryBudget(total, self.config.memory_fraction, weights, activation, block_bytes)

    @torch.inference_mode()
    def _profile_activation_peak(self, tokens: int) -> int | None:
        """Run one prefill of the largest step the scheduler can build; measure the peak."""
        blocks = math.ceil(tokens / self.config.block_size)
        caches = self._allocate_kv(blocks)
        meta = build_metadata(
            [SeqSpan(0, tokens, list(range(blocks)))],
            self.config.block_size,
            self.model_cfg.sliding_window,
            self.device,
            self.block_mask_fn,
        )
        ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(tokens, device=self.device)
        with measure_peak(self.device) as peak:
            hidden = self.model(ids, positions, caches, meta)
            self.model.compute_logits(hidden[-256:]).float()
            del hidden
        del caches
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return peak.bytes

    def _install_flex(self) -> None:
        """FlexAttention for prefill; compiled on CUDA (eager on CPU, where tests check masks)."""
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        from kvscale_engine.layers.attention import PagedAttention

        cuda = self.device.type == "cuda"
        attend = torch.compile(flex_attention, dynamic=True) if cuda else flex_attention
        self.block_mask_fn = torch.compile(create_block_mask) if cuda else create_block_mask
        for module in self.model.modules():
            if isinstance(module, PagedAttention):
                module.flex_fn = attend


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def _use_flex(config: EngineConfig, device: torch.device) -> bool:
    if config.attention_backend == "auto":
        return device.type == "cuda"
    return config.attention_backend == "flex"
