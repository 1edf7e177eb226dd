"""Content hashes for full KV blocks, chained so a hash names the whole prefix up to its block.

A block's hash covers its parent's hash, its token ids and a salt for everything else that
changes the KV (model, dtype, dummy seed). Two sequences that share a hash share the block.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

NO_PARENT = 0


def block_hash(parent: int, token_ids: Sequence[int], salt: str) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(parent.to_bytes(8, "little"))
    h.update(salt.encode())
    h.update(b"".join(t.to_bytes(4, "little", signed=False) for t in token_ids))
    return int.from_bytes(h.digest(), "little")


def chain_hashes(token_ids: Sequence[int], block_size: int, salt: str) -> list[int]:
    """Hashes of every full block of `token_ids`, in order."""
    hashes: list[int] = []
    parent = NO_PARENT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size], salt)
        hashes.append(parent)
    return hashes
