"""Attention over the paged KV cache.

Each layer's cache is a flat [slots, kv_heads, head_dim] pair; slot = block_id * block_size +
offset. A step writes its new K/V at `slot_mapping`, then attends over each sequence's slots:

- `reference` (CPU and GPU): decodes batched into one SDPA call over gathered, padded contexts,
  gathered a whole block at a time (one `index_select` row per block, not per token: per-token
  advanced indexing was a third of a CPU decode step at 32 in flight), in groups of similar
  length (the runner orders decodes by length; a group spans at most a factor of two, so padding
  is under half of what a group gathers); each prefill chunk its own SDPA call (plain causal
  when the chunk is the whole context; on the CPU in chunks of 64 queries, `_causal_chunks`).
- paged decode (CUDA, `paged_decode.py`): when the runner installs it, decodes read K/V through
  their block tables in a Triton kernel instead of the gathered SDPA call; no gather, no mask.
- `flex` (CUDA): decodes as above; all prefill chunks in one FlexAttention call over the packed
  chunks with a block-sparse mask that keeps each query inside its own sequence and causal
  (compiled, dynamic shapes). Decodes stay on SDPA: a 128-row query tile of 128 different
  sequences would make a block-sparse mask dense.

The last layer's output is needed only at the rows that sample (a prompt's last token, each
decode). When a step holds other rows (a prefill chunk), `last_layer` lists the rows to keep and
its own metadata: the model writes every row's K/V there as usual, then attends, projects and runs
the MLP for the kept rows alone, each as a decode over its whole context. A prompt of n tokens
then runs its last layer's attention output, o_proj and MLP once, not n times (an eighth less
prefill work in an eight-layer model).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from kvscale_engine.layers.cpu_ops import CpuOps
from kvscale_engine.layers.slots import slot_of

FLEX_PAD = 128
CAUSAL_CHUNK = 64  # query rows a causal prefill call takes on the CPU (fastest of 64/128/256)
BlockMaskFn = Callable[..., Any]  # torch's create_block_mask, compiled on CUDA
DecodeFn = Callable[..., torch.Tensor]  # paged_decode with block size and window bound


@dataclass(frozen=True)
class SeqSpan:
    """One sequence's slice of the flattened batch."""

    start: int  # position of its first new token
    num_tokens: int
    block_table: list[int]

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class PrefillSpan:
    q_start: int
    q_len: int
    kv_index: torch.Tensor | None  # None: the chunk is the whole context, use fresh K/V
    mask: torch.Tensor | None  # None: plain causal
    # plain causal on the CPU, in chunks of queries: (first row, mask over keys up to its last)
    causal_chunks: tuple[tuple[int, torch.Tensor], ...] = ()


@dataclass(frozen=True)
class DecodeGroup:
    """Decode rows [start, stop) of similar length: their K/V blocks and padding mask."""

    start: int
    stop: int
    kv_blocks: torch.Tensor  # [rows * max_blocks]
    mask: torch.Tensor  # [rows, 1, 1, max_blocks * block_size]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor
    num_decodes: int = 0
    decode_groups: list[DecodeGroup] = field(default_factory=list)  # reference decode
    decode_block_tables: torch.Tensor | None = None  # paged decode: [decodes, max_blocks]
    decode_context_lens: torch.Tensor | None = None  # paged decode: [decodes]
    prefills: list[PrefillSpan] = field(default_factory=list)
    flex: FlexInputs | None = None
    last_layer: LastLayer | None = None


@dataclass(frozen=True)
class LastLayer:
    """The rows whose output the last layer computes, and its metadata: all rows' slots, the kept
    rows as decodes over their contexts."""

    rows: torch.Tensor
    meta: AttentionMetadata


@dataclass(frozen=True)
class FlexInputs:
    kv_index: torch.Tensor
    block_mask: Any
    num_queries: int


def slots_of(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    return block_table[positions // block_size] * block_size + positions % block_size


def build_metadata(
    spans: list[SeqSpan],
    block_size: int,
    window: int | None,
    device: torch.device,
    block_mask_fn: BlockMaskFn | None = None,
    paged_decode: bool = False,
    outputs: list[int] | None = None,
) -> AttentionMetadata:
    """`spans` lists decodes (one token) first, then prefill chunks; flex given a mask builder;
    decodes as block tables and context lengths for the paged kernel when `paged_decode`;
    `outputs`: the spans whose last row needs the model's output (all of them when None)."""
    n = sum(1 for s in spans if s.num_tokens == 1)
    if any(s.num_tokens != 1 for s in spans[:n]):
        raise ValueError("build_metadata takes the decodes (one-token spans) first")
    # a decode's one slot in plain arithmetic, and one tensor for them all: a tensor per span
    # cost 28 us each, 1.8 ms of a step at 64 in flight (3%)
    slots = [slot_of(s.block_table, s.start, block_size) for s in spans[:n]]
    tables = [torch.tensor(s.block_table, dtype=torch.long) for s in spans[n:]]
    positions = [torch.arange(s.start, s.end) for s in spans[n:]]
    parts = [slots_of(t, p, block_size) for t, p in zip(tables, positions, strict=True)]
    slot_mapping = torch.cat([torch.tensor(slots, dtype=torch.long), *parts])
    meta = AttentionMetadata(slot_mapping=slot_mapping.to(device))
    meta.num_decodes = n
    if n:
        _decode_inputs(meta, spans[:n], block_size, window, device, paged_decode)
    if outputs is not None and len(outputs) < len(slot_mapping):
        meta.last_layer = _last_layer(
            spans, outputs, meta.slot_mapping, block_size, window, device, paged_decode
        )
    if block_mask_fn is not None and n < len(spans):
        meta.flex = _flex_inputs(
            spans[n:], tables, positions, block_size, window, device, block_mask_fn
        )
        return meta
    q_start = n
    for span, table, pos in zip(spans[n:], tables, positions, strict=True):
        meta.prefills.append(_prefill_span(span, table, pos, q_start, block_size, window, device))
        q_start += span.num_tokens
    return meta


def _last_layer(
    spans: list[SeqSpan],
    outputs: list[int],
    slot_mapping: torch.Tensor,
    block_size: int,
    window: int | None,
    device: torch.device,
    paged_decode: bool,
) -> LastLayer:
    """The kept rows (each output span's last) attend as decodes over their whole contexts."""
    ends = list(itertools.accumulate(s.num_tokens for s in spans))
    rows = torch.tensor([ends[i] - 1 for i in outputs], dtype=torch.long)
    meta = AttentionMetadata(slot_mapping=slot_mapping, num_decodes=len(outputs))
    if outputs:
        tails = [SeqSpan(spans[i].end - 1, 1, spans[i].block_table) for i in outputs]
        _decode_inputs(meta, tails, block_size, window, device, paged_decode)
    return LastLayer(rows.to(device), meta)


def _decode_inputs(
    meta: AttentionMetadata,
    spans: list[SeqSpan],
    block_size: int,
    window: int | None,
    device: torch.device,
    paged_decode: bool,
) -> None:
    if paged_decode:
        tables, ends = _tables(spans, block_size)
        meta.decode_block_tables = tables.to(torch.int32).to(device)
        meta.decode_context_lens = ends.squeeze(1).to(torch.int32).to(device)
        return
    for start, stop in _length_groups([s.end for s in spans]):
        tables, ends = _tables(spans[start:stop], block_size)
        pos = torch.arange(tables.shape[1] * block_size).expand(stop - start, -1)
        mask = pos < ends
        if window is not None:
            mask &= pos > ends - 1 - window
        meta.decode_groups.append(
            DecodeGroup(start, stop, tables.flatten().to(device), mask[:, None, None, :].to(device))
        )


def _tables(spans: list[SeqSpan], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables padded to the longest span's blocks with block 0, and each span's end."""
    max_blocks = -(-max(s.end for s in spans) // block_size)
    rows = [s.block_table[:max_blocks] for s in spans]
    tables = torch.tensor([r + [0] * (max_blocks - len(r)) for r in rows], dtype=torch.long)
    return tables, torch.tensor([s.end for s in spans]).unsqueeze(1)


def _length_groups(ends: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of rows whose lengths stay within twice the run's first length."""
    groups, start = [], 0
    for row in range(1, len(ends) + 1):
        if row == len(ends) or not ends[start] <= ends[row] <= 2 * ends[start]:
            groups.append((start, row))
            start = row
    return groups


def _prefill_span(
    span: SeqSpan,
    table: torch.Tensor,
    pos: torch.Tensor,
    q_start: int,
    block_size: int,
    window: int | None,
    device: torch.device,
) -> PrefillSpan:
    fresh = span.start == 0
    kv_pos = torch.arange(span.end)
    mask = kv_pos.unsqueeze(0) <= pos.unsqueeze(1)
    if window is not None and span.end > window:
        mask &= kv_pos.unsqueeze(0) > pos.unsqueeze(1) - window
    elif fresh:  # plain causal
        chunks = _causal_chunks(span.num_tokens) if device.type == "cpu" else ()
        return PrefillSpan(q_start, span.num_tokens, None, None, chunks)
    kv_index = None if fresh else slots_of(table, kv_pos, block_size).to(device)
    return PrefillSpan(q_start, span.num_tokens, kv_index, mask.to(device))


def _causal_chunks(n: int) -> tuple[tuple[int, torch.Tensor], ...]:
    """A whole prompt's causal attention on the CPU in chunks of queries, each over the keys up
    to its last row. torch's CPU kernel skips masked key blocks only in blocks of 512, so one
    call computes the whole square below that; the chunks skip most of the upper half (a
    360-token prefill of the benchmark's model 191 -> 185 ms, 1,000 tokens 566 -> 552 ms). Built
    once a step, shared by every layer; none (one causal call) for a prompt of one chunk."""
    if n <= CAUSAL_CHUNK:
        return ()
    starts = range(0, n, CAUSAL_CHUNK)
    ends = [min(n, a + CAUSAL_CHUNK) for a in starts]
    return tuple(
        (a, torch.arange(b) <= torch.arange(a, b).unsqueeze(1))
        for a, b in zip(starts, ends, strict=True)
    )


def _flex_inputs(
    spans: list[SeqSpan],
    tables: list[torch.Tensor],
    positions: list[torch.Tensor],
    block_size: int,
    window: int | None,
    device: torch.device,
    block_mask_fn: BlockMaskFn,
) -> FlexInputs:
    num_q = sum(s.num_tokens for s in spans)
    kv_pos = [torch.arange(s.end) for s in spans]
    kv_index = torch.cat([slots_of(t, p, block_size) for t, p in zip(tables, kv_pos, strict=True)])
    q_seq = _padded(torch.cat([torch.full((s.num_tokens,), i) for i, s in enumerate(spans)]), -1)
    kv_seq = _padded(torch.cat([torch.full((s.end,), i) for i, s in enumerate(spans)]), -2)
    q_pos, k_pos = _padded(torch.cat(positions), 0), _padded(torch.cat(kv_pos), 0)
    q_seq, kv_seq, q_pos, k_pos = (t.to(device) for t in (q_seq, kv_seq, q_pos, k_pos))

    def mask_mod(b: Any, h: Any, q: Any, kv: Any) -> Any:
        keep = (q_seq[q] == kv_seq[kv]) & (k_pos[kv] <= q_pos[q])
        return keep if window is None else keep & (k_pos[kv] > q_pos[q] - window)

    block_mask = block_mask_fn(mask_mod, None, None, len(q_seq), len(kv_seq), device=str(device))
    return FlexInputs(_padded(kv_index, 0).to(device), block_mask, num_q)


def _padded(t: torch.Tensor, value: int) -> torch.Tensor:
    pad = -len(t) % FLEX_PAD
    return torch.cat([t, torch.full((pad,), value, dtype=t.dtype)]) if pad else t


class PagedAttention(torch.nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.flex_fn: Callable[..., torch.Tensor] | None = None  # set by the model runner
        self.decode_fn: DecodeFn | None = None  # set by the model runner
        self.cpu_ops: CpuOps | None = None  # set by the model's use_cpu_ops()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q: [tokens, heads, dim]; k, v: [tokens, kv_heads, dim]; returns [tokens, heads, dim]."""
        k_cache, v_cache = kv_cache
        if self.cpu_ops is not None:
            self.cpu_ops.kv_write(k, v, k_cache, v_cache, meta.slot_mapping)
        else:
            k_cache.index_copy_(0, meta.slot_mapping, k)
            v_cache.index_copy_(0, meta.slot_mapping, v)
        if meta.num_decodes == q.shape[0] and meta.flex is None and not meta.prefills:
            return self._decode(q, k_cache, v_cache, meta)  # a decode-only step: no copy out
        out = torch.empty_like(q)
        if meta.num_decodes:  # decode
            out[: meta.num_decodes] = self._decode(q[: meta.num_decodes], k_cache, v_cache, meta)
        if meta.flex is not None:  # prefill, packed
            out[meta.num_decodes :] = self._flex(q[meta.num_decodes :], k_cache, v_cache, meta.flex)
            return out
        for span in meta.prefills:  # prefill
            rows = slice(span.q_start, span.q_start + span.q_len)
            if span.causal_chunks:
                out[rows] = self._causal(q[rows], k[rows], v[rows], span.causal_chunks)
            elif span.kv_index is None:
                out[rows] = self._sdpa(q[rows], k[rows], v[rows], span.mask)
            else:
                kk, vv = k_cache[span.kv_index], v_cache[span.kv_index]
                out[rows] = self._sdpa(q[rows], kk, vv, span.mask)
        return out

    def _sdpa(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.transpose(0, 1).unsqueeze(0),
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        return o.squeeze(0).transpose(0, 1)

    def _causal(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        chunks: tuple[tuple[int, torch.Tensor], ...],
    ) -> torch.Tensor:
        """A whole prompt's causal attention, chunk by chunk (`_causal_chunks`)."""
        out = torch.empty_like(q)
        for start, mask in chunks:
            rows, keys = slice(start, start + mask.shape[0]), mask.shape[1]
            out[rows] = self._sdpa(q[rows], k[:keys], v[:keys], mask)
        return out

    def _decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, m: AttentionMetadata
    ) -> torch.Tensor:
        if m.decode_block_tables is not None:  # paged kernel
            assert self.decode_fn is not None, "paged decode metadata without a decode function"
            return self.decode_fn(
                q, k_cache, v_cache, m.decode_block_tables, m.decode_context_lens, scale=self.scale
            )
        if len(m.decode_groups) == 1:
            return self._decode_group(q, k_cache, v_cache, m.decode_groups[0])
        out = torch.empty_like(q)
        for g in m.decode_groups:
            out[g.start : g.stop] = self._decode_group(q[g.start : g.stop], k_cache, v_cache, g)
        return out

    def _decode_group(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: DecodeGroup
    ) -> torch.Tensor:
        batch, _, _, ctx = g.mask.shape  # ctx: whole blocks
        block_size = ctx * batch // len(g.kv_blocks)
        kk, vv = (  # [batch, kv_heads, ctx, dim]
            c.view(-1, block_size, *c.shape[1:])
            .index_select(0, g.kv_blocks)
            .view(batch, ctx, *c.shape[1:])
            .transpose(1, 2)
            for c in (k_cache, v_cache)
        )
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), kk, vv, attn_mask=g.mask, scale=self.scale, enable_gqa=True
        )
        return o.squeeze(2)

    def _flex(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, f: FlexInputs
    ) -> torch.Tensor:
        assert self.flex_fn is not None, "flex metadata without a flex attention function"
        qq = q.new_zeros(_padded_len(q.shape[0]), q.shape[1], q.shape[2])
        qq[: q.shape[0]] = q
        kk, vv = k_cache[f.kv_index], v_cache[f.kv_index]
        o = self.flex_fn(
            qq.transpose(0, 1).unsqueeze(0),
            kk.transpose(0, 1).unsqueeze(0),
            vv.transpose(0, 1).unsqueeze(0),
            block_mask=f.block_mask,
            scale=self.scale,
            enable_gqa=True,
        )
        return o.squeeze(0).transpose(0, 1)[: f.num_queries]


def _padded_len(n: int) -> int:
    return n + (-n % FLEX_PAD)
