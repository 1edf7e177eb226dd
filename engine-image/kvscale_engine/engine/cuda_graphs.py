"""CUDA-graph bookkeeping: which batch sizes are captured, the static inputs, when a step replays.

A captured graph replays fixed kernels on fixed buffers, so decode steps are padded up to the
nearest captured batch size ("bucket"), their inputs copied into static buffers sized for the
largest bucket, and the padding rows pointed at a scratch KV slot that no sequence owns. Only a
pure decode step within the captured sizes replays; prefill and mixed steps, and anything larger,
run eager. Plain Python, no torch: the model runner turns these shapes and rows into tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from kvscale_engine.layers.slots import slot_of

MAX_CAPTURE_SIZE = 512  # vLLM's default cap: larger decode batches are rare and run eager
INT32 = "int32"
INT64 = "int64"


def capture_sizes(max_num_seqs: int, cap: int = MAX_CAPTURE_SIZE) -> tuple[int, ...]:
    """1, 2, 4, 8, then multiples of 8 up to min(max_num_seqs, cap); that limit is the last."""
    limit = min(max_num_seqs, cap)
    sizes = [s for s in (1, 2, 4, *range(8, limit + 1, 8)) if s <= limit]
    if sizes[-1] != limit:
        sizes.append(limit)
    return tuple(sizes)


def bucket_for(batch: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds `batch`; None when none does."""
    return next((s for s in sizes if s >= batch), None)


class Replay(Enum):
    """Whether a step may replay a graph, and if not, why it runs eager."""

    REPLAY = "replay"
    DISABLED = "disabled"  # --enforce-eager, or not on CUDA
    PREFILL = "prefill"  # every sequence feeds more than one token
    MIXED = "mixed"  # decodes and prefill chunks in one step
    OVERSIZE = "oversize"  # more sequences than the largest bucket
    LONG_CONTEXT = "long-context"  # a context longer than the block tables were captured for


@dataclass(frozen=True)
class GraphPlan:
    """What is captured: one graph per size, all sharing static buffers sized for the largest."""

    sizes: tuple[int, ...]
    max_context: int  # tokens a captured block table row can address
    block_size: int
    scratch_slot: int  # a KV slot outside every sequence's blocks; padding rows write there

    @classmethod
    def of(
        cls, max_num_seqs: int, max_model_len: int, block_size: int, num_kv_blocks: int
    ) -> GraphPlan:
        """The scratch slot is the first slot of one extra block past the pool's `num_kv_blocks`."""
        return cls(
            capture_sizes(max_num_seqs), max_model_len, block_size, num_kv_blocks * block_size
        )

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    @property
    def max_blocks(self) -> int:
        return -(-self.max_context // self.block_size)

    @property
    def scratch_block(self) -> int:
        return self.scratch_slot // self.block_size

    def buffer_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Static input buffers: name -> (shape, dtype)."""
        b = self.max_batch
        return {
            "token_ids": ((b,), INT64),
            "positions": ((b,), INT64),
            "slot_mapping": ((b,), INT64),
            "block_tables": ((b, self.max_blocks), INT32),
            "context_lens": ((b,), INT32),
        }

    def decide(
        self, new_tokens: Sequence[int], context_lens: Sequence[int], enabled: bool
    ) -> Replay:
        """new_tokens: tokens each sequence feeds this step; context_lens: its length after it."""
        decodes = sum(1 for n in new_tokens if n == 1)
        if not enabled:
            return Replay.DISABLED
        if decodes == 0:
            return Replay.PREFILL
        if decodes < len(new_tokens):
            return Replay.MIXED
        if len(new_tokens) > self.max_batch:
            return Replay.OVERSIZE
        if max(context_lens) > self.max_context:
            return Replay.LONG_CONTEXT
        return Replay.REPLAY


@dataclass(frozen=True)
class DecodeRows:
    """One decode step's inputs, padded to its bucket: what the runner copies into the buffers."""

    bucket: int
    num_seqs: int  # the real rows, first; the rest is padding
    token_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    block_tables: list[list[int]]  # each row max_blocks long
    context_lens: list[int]


def pad_decode(
    plan: GraphPlan,
    token_ids: Sequence[int],
    positions: Sequence[int],
    block_tables: Sequence[Sequence[int]],
) -> DecodeRows:
    """A pure decode step (one token per sequence at `positions`) padded to its bucket.

    Real rows write their token's K/V at its slot and attend over positions + 1 tokens. Padding
    rows feed token 0 at position 0, write to the scratch slot and attend over that slot alone, so
    they touch no sequence's KV; their outputs are dropped.
    """
    bucket = bucket_for(len(token_ids), plan.sizes)
    assert bucket is not None, f"{len(token_ids)} decodes exceed the largest bucket"
    bs, width = plan.block_size, plan.max_blocks
    slots = [slot_of(table, p, bs) for p, table in zip(positions, block_tables, strict=True)]
    rows = [list(t[:width]) + [plan.scratch_block] * (width - len(t[:width])) for t in block_tables]
    pad = bucket - len(token_ids)
    return DecodeRows(
        bucket,
        len(token_ids),
        [*token_ids, *[0] * pad],
        [*positions, *[0] * pad],
        [*slots, *[plan.scratch_slot] * pad],
        [*rows, *[[plan.scratch_block] * width for _ in range(pad)]],
        [*(p + 1 for p in positions), *[1] * pad],
    )
