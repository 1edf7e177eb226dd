"""Paged KV-cache bookkeeping: fixed-size blocks, ref counts and the automatic prefix cache.

A block is named by the chained hash of its tokens once the step that computes its KV is scheduled
(`publish`): every layer writes the whole step's K/V before any row attends, so a request admitted
later in the same step attends over a prefix an earlier one computes there, and a wave of requests
with one new system prompt computes it once, not once each. Only blocks the step fills completely
are named, so a chunked prefill never publishes a half-written block, and preemption happens
between steps, after the blocks were written. Freed hashed blocks stay in an LRU pool and are
revived by a later hit; allocation takes never-hashed free blocks first and only then evicts the
least recently freed cached block. No torch here.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from kvscale_engine.engine.prefix_hash import NO_PARENT, block_hash, chain_hashes
from kvscale_engine.engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, salt: str = ""
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.salt = salt
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # least recently freed first
        self.hash_to_block: dict[int, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_uncached) + len(self.free_cached)

    def blocks_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def lookup_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks for the longest computed prefix, keeping at least one token to compute."""
        if not self.enable_prefix_caching or seq.block_table:
            return []
        usable = (seq.num_tokens - 1) // self.block_size * self.block_size
        hits: list[int] = []
        for h in chain_hashes(seq.token_ids[:usable], self.block_size, self.salt):
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence, num_tokens: int, prefix: list[int]) -> bool:
        fresh = self.blocks_needed(num_tokens) - len(seq.block_table) - len(prefix)
        revived = sum(1 for b in prefix if self.blocks[b].ref_count == 0)
        return max(fresh, 0) + revived <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int, prefix: list[int]) -> None:
        """Grow `seq.block_table` to hold `num_tokens`; a prefix hit marks its tokens computed."""
        if not seq.block_table:  # admission from the waiting queue
            self._claim_prefix(seq, prefix)
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_free())

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):  # tail blocks become the first to evict
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} freed twice"
            if block.ref_count == 0:
                if block.block_hash is None:
                    self.free_uncached.append(block_id)
                else:
                    self.free_cached[block_id] = None
        seq.block_table = []

    def publish(self, seq: Sequence, num_tokens: int) -> None:
        """Name the blocks whose KV is computed once this step has run `seq` up to `num_tokens`."""
        if not self.enable_prefix_caching:
            return
        while seq.num_hashed_blocks < num_tokens // self.block_size:
            index = seq.num_hashed_blocks
            parent = NO_PARENT if seq.last_block_hash is None else seq.last_block_hash
            h = block_hash(parent, seq.block_tokens(index, self.block_size), self.salt)
            block = self.blocks[seq.block_table[index]]
            if block.block_hash is None and h not in self.hash_to_block:
                block.block_hash = h
                self.hash_to_block[h] = block.block_id
            seq.last_block_hash = h
            seq.num_hashed_blocks += 1

    def _claim_prefix(self, seq: Sequence, prefix: list[int]) -> None:
        self.prefix_cache_queries += seq.num_tokens
        self.prefix_cache_hits += len(prefix) * self.block_size
        for block_id in prefix:
            self._ref(block_id)
            seq.block_table.append(block_id)
        seq.num_computed_tokens = len(prefix) * self.block_size
        if seq.num_output_tokens == 0:  # a recompute after preemption is not a client's hit
            seq.num_cached_tokens = seq.num_computed_tokens
        seq.num_hashed_blocks = len(prefix)
        seq.last_block_hash = self.blocks[prefix[-1]].block_hash if prefix else None

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_cached[block_id]
        block.ref_count += 1

    def _take_free(self) -> int:
        if self.free_uncached:
            block_id = self.free_uncached.popleft()
        else:
            block_id, _ = self.free_cached.popitem(last=False)
            evicted = self.blocks[block_id]
            assert evicted.block_hash is not None
            del self.hash_to_block[evicted.block_hash]
            evicted.block_hash = None
        self.blocks[block_id].ref_count = 1
        return block_id
