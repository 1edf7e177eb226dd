"""Decode steps as CUDA graphs: one graph per batch-size bucket, replayed on static buffers.

The bookkeeping (buckets, shapes, padding, the replay rule) is plain Python in `cuda_graphs.py`;
this is only the device half. It needs the paged decode kernel: its block tables and context
lengths live in the static buffers, so a replay sees each step's contexts without any host-side
shape. Graphs share one memory pool and are captured largest first. CUDA only; not yet run on a
GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from kvscale_engine.engine.cuda_graphs import INT32, DecodeRows, GraphPlan
from kvscale_engine.layers.attention import AttentionMetadata
from kvscale_engine.models.llama import KVCache


class DecodeGraphs:
    def __init__(
        self, model: Any, kv_caches: list[KVCache], plan: GraphPlan, device: torch.device
    ) -> None:
        self.model, self.kv_caches, self.plan = model, kv_caches, plan
        self.buffers = {
            name: torch.zeros(
                shape, dtype=torch.int32 if dtype == INT32 else torch.long, device=device
            )
            for name, (shape, dtype) in plan.buffer_shapes().items()
        }
        self.buffers["slot_mapping"].fill_(plan.scratch_slot)
        self.buffers["context_lens"].fill_(1)
        self.buffers["block_tables"].fill_(plan.scratch_block)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for size in reversed(self.plan.sizes):
            self._forward(size)  # warm-up: kernels compiled, workspaces allocated
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph

    def replay(self, rows: DecodeRows) -> torch.Tensor:
        """Hidden states of the real rows (the padding rows' are dropped)."""
        n = rows.bucket
        for name in ("token_ids", "positions", "slot_mapping", "context_lens"):
            self._copy(name, getattr(rows, name))
        self._copy("block_tables", rows.block_tables)
        self.graphs[n].replay()
        return self.outputs[n][: rows.num_seqs]

    def _copy(self, name: str, values: list[int] | list[list[int]]) -> None:
        buffer = self.buffers[name]
        host = torch.tensor(values, dtype=buffer.dtype).pin_memory()
        buffer[: host.shape[0]].copy_(host, non_blocking=True)

    def _forward(self, size: int) -> torch.Tensor:
        b = self.buffers
        meta = AttentionMetadata(
            slot_mapping=b["slot_mapping"][:size],
            num_decodes=size,
            decode_block_tables=b["block_tables"][:size],
            decode_context_lens=b["context_lens"][:size],
        )
        out: torch.Tensor = self.model(
            b["token_ids"][:size], b["positions"][:size], self.kv_caches, meta
        )
        return out
