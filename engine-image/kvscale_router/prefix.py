"""Keys for the first blocks of a prompt, chained so each key names the whole prefix up to it.

Token-id prompts are cut into the engine's blocks; text prompts into chunks of about a block's
worth of characters. Equal keys mean equal prefixes, so the replica that served a key before
probably still holds those KV blocks in its prefix cache.
"""

from __future__ import annotations

import hashlib

from kvscale_router.protocol import TEXT_CHARS_PER_TOKEN


def _chain(parent: int, data: bytes) -> int:
    h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(data)
    return int.from_bytes(h.digest(), "little")


def block_keys(prompt: str | list[int], block_size: int, max_blocks: int) -> list[int]:
    """Chained keys of the prompt's first full blocks (at most max_blocks of them)."""
    if isinstance(prompt, str):
        size = block_size * TEXT_CHARS_PER_TOKEN
        chunks = [prompt[i : i + size].encode() for i in range(0, len(prompt) - size + 1, size)]
    else:
        chunks = [
            b"".join(t.to_bytes(4, "little", signed=False) for t in prompt[i : i + block_size])
            for i in range(0, len(prompt) - block_size + 1, block_size)
        ]
    keys: list[int] = []
    parent = 0
    for chunk in chunks[:max_blocks]:
        parent = _chain(parent, chunk)
        keys.append(parent)
    return keys
