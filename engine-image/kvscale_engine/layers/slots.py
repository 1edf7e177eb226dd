"""Where a token's K/V lives: the KV-cache slot of a position, from its sequence's block table.

Plain Python, no torch: the decode graphs' bookkeeping (engine/cuda_graphs.py) uses it too;
attention.py's `slots_of` is the same arithmetic over tensors of positions.
"""

from __future__ import annotations

from collections.abc import Sequence


def slot_of(block_table: Sequence[int], position: int, block_size: int) -> int:
    """The slot that `position` of a sequence with this block table occupies."""
    return block_table[position // block_size] * block_size + position % block_size
