"""The only part of the engine that touches the device: KV cache, forward pass, sampling.

At start it loads the model, sizes the KV pool from the memory budget (device memory, weights, and
the activation peak measured over a profiling pass) and allocates one flat K and V tensor per
layer. Decodes run through the Triton paged-decode kernel on CUDA and, unless --enforce-eager,
replay a CUDA graph per batch-size bucket (`cuda_graphs.py`, `graph_runner.py`); prefill and mixed
steps run eager. On the CPU, fp32 decodes read K/V through the C kernel (`layers/cpu_decode.c`),
the linears multiply by weights that oneDNN reordered once at load (`layers/packed_linear.py`),
steps of 1-3 rows multiply by the weights as loaded (MKL is faster there), RMSNorm, the rotary
embedding and the KV cache write are one C call each (`layers/cpu_ops.c`),
glibc's malloc keeps the freed activations for the next step and the KV cache asks for huge
pages (`host_allocator.py`).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING

import torch

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.cuda_graphs import GraphPlan, Replay, pad_decode
from kvscale_engine.engine.device_memory import measure_peak, total_bytes
from kvscale_engine.engine.host_allocator import huge_pages, keep_freed_buffers
from kvscale_engine.engine.loader import load_model
from kvscale_engine.engine.memory_budget import (
    MemoryBudget,
    estimated_activation_bytes,
    kv_block_bytes,
    plan_num_blocks,
)
from kvscale_engine.engine.scheduler import ScheduledBatch, ScheduledSeq
from kvscale_engine.layers import cpu_gemm, cpu_ops
from kvscale_engine.layers.attention import BlockMaskFn, DecodeFn, SeqSpan, build_metadata
from kvscale_engine.layers.packed_linear import PackedLinear, can_pack, pack_linears
from kvscale_engine.layers.sampler import SampleRequest, sample, to_device
from kvscale_engine.model_config import ModelConfig
from kvscale_engine.models.llama import KVCache

if TYPE_CHECKING:
    from kvscale_engine.engine.graph_runner import DecodeGraphs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, model_cfg: ModelConfig) -> None:
        self.config = config
        self.model_cfg = model_cfg
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu":  # activations live in host memory: keep freed buffers
            keep_freed_buffers()
        self.model = load_model(config, model_cfg, self.device, self.dtype)
        if can_pack(self.device, self.dtype):  # fp32 on the CPU: oneDNN's blocked weights
            # and a copy for small batches: the C kernel's panels (1-48 rows), else the
            # checkpoint's layout (1-3 rows)
            small = config.small_batch_weights
            gemm = cpu_gemm.load() if small else None
            self.model.fuse_projections(
                functools.partial(PackedLinear.fused, small_batch=small, gemm=gemm)
            )
            pack_linears(self.model, small, gemm)
            ops = cpu_ops.load()  # RMSNorm, rotary and the cache write as one C call each
            if ops is not None:
                self.model.use_cpu_ops(ops)
        self.block_mask_fn: BlockMaskFn | None = None
        if _use_flex(config, self.device):
            self._install_flex()
        self.decode_attention = self._install_decode_attention()
        self.budget: MemoryBudget | None = None
        if config.num_kv_blocks is None:
            self.budget = self._measure_budget()
        self.num_kv_blocks = (
            plan_num_blocks(config, self.budget) if self.budget else (config.num_kv_blocks or 0)
        )
        self.graph_plan: GraphPlan | None = None
        self.graphs: DecodeGraphs | None = None
        if self.paged_decode and not config.enforce_eager and self.device.type == "cuda":
            self._capture_graphs()
        else:
            self.kv_caches = self._allocate_kv(self.num_kv_blocks)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)

    @property
    def paged_decode(self) -> bool:
        """Decodes read K/V through their block tables (a kernel), not a gathered copy."""
        return self.decode_attention != "reference"

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int]:
        """One forward over the batch; a token for each sequence that samples, in batch order."""
        # decodes first, shortest first (the reference attention gathers them by length)
        items = sorted(
            batch.seqs, key=lambda s: (s.num_new_tokens != 1, s.end * (s.num_new_tokens == 1))
        )
        sampling = [n for n, i in enumerate(items) if i.samples]
        hidden = self._replay(items) if self.graphs is not None else None
        if hidden is None:  # eager: the last layer computes the sampling rows alone
            hidden = self._forward(items, sampling)
        else:
            ends = list(itertools.accumulate(i.num_new_tokens for i in items))
            last = to_device([ends[n] - 1 for n in sampling], torch.long, self.device)
            hidden = hidden.index_select(0, last)
        logits = self.model.compute_logits(hidden).float()
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

    def _forward(self, items: list[ScheduledSeq], sampling: list[int]) -> torch.Tensor:
        """Hidden states of the last row of each item in `sampling`."""
        input_ids, positions = self._inputs(items)
        spans = [SeqSpan(i.start, i.num_new_tokens, i.seq.block_table) for i in items]
        meta = build_metadata(
            spans,
            self.config.block_size,
            self.model_cfg.sliding_window,
            self.device,
            self.block_mask_fn,
            self.paged_decode,
            outputs=sampling,
        )
        # without last_layer every row samples (one token each), so every row is wanted
        out: torch.Tensor = self.model(input_ids, positions, self.kv_caches, meta)
        return out

    def _replay(self, items: list[ScheduledSeq]) -> torch.Tensor | None:
        """A pure decode step within the captured sizes replays its bucket's graph."""
        assert self.graph_plan is not None
        new = [i.num_new_tokens for i in items]
        if self.graph_plan.decide(new, [i.end for i in items], True) is not Replay.REPLAY:
            return None
        ids = [i.seq.token_ids[i.start] for i in items]
        rows = pad_decode(
            self.graph_plan, ids, [i.start for i in items], [i.seq.block_table for i in items]
        )
        assert self.graphs is not None
        return self.graphs.replay(rows)

    def _capture_graphs(self) -> None:
        """One extra KV block holds the padding rows' writes; then capture every bucket."""
        from kvscale_engine.engine.graph_runner import DecodeGraphs

        c = self.config
        plan = GraphPlan.of(c.max_num_seqs, c.max_model_len, c.block_size, self.num_kv_blocks)
        self.kv_caches = self._allocate_kv(self.num_kv_blocks + 1)
        self.graph_plan, self.graphs = (
            plan,
            DecodeGraphs(self.model, self.kv_caches, plan, self.device),
        )
        self.graphs.capture()

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
            (self._zeros(shape), self._zeros(shape))
            for _ in range(self.model_cfg.num_hidden_layers)
        ]

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        t = torch.empty(shape, dtype=self.dtype, device=self.device)
        if self.device.type == "cpu":  # before the first write: huge pages from the start
            huge_pages(t)
        return t.zero_()

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

    def _install_decode_attention(self) -> str:
        """Which decode attention runs (reference, triton or cpu); installs a paged kernel."""
        kind = _decode_attention(self.config, self.device, self.dtype)
        if kind == "reference":
            return kind
        if kind == "cpu":
            from kvscale_engine.layers import cpu_decode

            unsupported = cpu_decode.unsupported(self.model_cfg, self.config.block_size)
            if unsupported and self.config.decode_attention == "cpu":
                raise ValueError(f"--decode-attention cpu: {unsupported}")
            kernel = None if unsupported else cpu_decode.load()
            if kernel is None:
                if self.config.decode_attention == "cpu":
                    raise RuntimeError("--decode-attention cpu: the CPU kernel could not be built")
                return "reference"  # auto: the shape is beyond it, or load() logged why
            fn: DecodeFn = kernel
        else:
            from kvscale_engine.layers.paged_decode import paged_decode

            fn = paged_decode
        from kvscale_engine.layers.attention import PagedAttention

        window = self.model_cfg.sliding_window
        decode = functools.partial(fn, block_size=self.config.block_size, window=window)
        for module in self.model.modules():
            if isinstance(module, PagedAttention):
                module.decode_fn = decode
        return kind

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


def _decode_attention(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> str:
    """Triton on CUDA, the compiled C kernel for fp32 on the CPU; on the CPU Triton runs only when
    asked (tests, under Triton's interpreter)."""
    cpu_ok = device.type == "cpu" and dtype == torch.float32
    if config.decode_attention == "cpu" and not cpu_ok:
        raise ValueError(f"--decode-attention cpu needs fp32 on the CPU, not {dtype} on {device}")
    if config.decode_attention != "auto":
        return config.decode_attention
    if device.type == "cuda":
        return "triton"
    return "cpu" if cpu_ok else "reference"


def _use_flex(config: EngineConfig, device: torch.device) -> bool:
    if config.attention_backend == "auto":
        return device.type == "cuda"
    return config.attention_backend == "flex"
