"""Torch-free helpers for bookkeeping tests: invariant checks and a fake model runner.

The fake runner keeps a model of the KV cache (slot -> (token, position)) and checks, before
every step, that each scheduled sequence's computed prefix is really in its blocks. That is the
property prefix caching, chunking and preemption must never break.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvscale_engine.engine.block_manager import BlockManager
from kvscale_engine.engine.scheduler import ScheduledBatch
from kvscale_engine.engine.sequence import FinishReason, Sequence


def check_block_invariants(bm: BlockManager, holders: Iterable[Sequence]) -> None:
    holders = list(holders)
    refs = Counter(b for s in holders for b in s.block_table)
    for seq in holders:
        assert len(set(seq.block_table)) == len(seq.block_table), "block twice in one table"
        assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens
    for block in bm.blocks:
        assert block.ref_count >= 0
        assert block.ref_count == refs[block.block_id], f"block {block.block_id} leaked"
    free = [*bm.free_uncached, *bm.free_cached]
    assert len(free) == len(set(free)), "block freed twice"
    assert set(free) == {b.block_id for b in bm.blocks if b.ref_count == 0}
    assert all(bm.blocks[b].block_hash is None for b in bm.free_uncached)
    assert all(bm.blocks[b].block_hash is not None for b in bm.free_cached)
    assert {h: b for h, b in bm.hash_to_block.items()} == {
        b.block_hash: b.block_id for b in bm.blocks if b.block_hash is not None
    }


class FakeRunner:
    """Writes (token, position) into modelled KV slots and samples a token from the context."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.kv: dict[int, tuple[int, int]] = {}

    def slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def run(self, batch: ScheduledBatch) -> list[int]:
        """As a layer runs a step: every row's K/V written first, then each row attends over its
        sequence's context (so a prefix another row of the step computes counts as there)."""
        written: set[int] = set()
        for item in batch.seqs:
            seq = item.seq
            assert len(seq.block_table) * self.block_size >= item.end, "no slot for a new token"
            for pos in range(item.start, item.end):
                slot = self.slot(seq, pos)
                assert slot not in written, f"two rows of one step write slot {slot}"
                written.add(slot)
                self.kv[slot] = (seq.token_ids[pos], pos)
        tokens = []
        for item in batch.seqs:
            seq = item.seq
            for pos in range(item.end):
                assert self.kv.get(self.slot(seq, pos)) == (seq.token_ids[pos], pos), (
                    f"stale KV at position {pos} of {seq.request_id}"
                )
            if item.samples:
                tokens.append(sum(seq.token_ids[-3:]) % 11)
        return tokens


def stop_at_length(max_model_len: int):  # type: ignore[no-untyped-def]
    def check(seq: Sequence) -> FinishReason | None:
        if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= max_model_len:
            return "length"
        return None

    return check
