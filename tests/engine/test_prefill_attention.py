"""A whole prompt's causal attention, taken in chunks of queries on the CPU, equals one call
(a one-token prompt is a decode, so prompts start at two).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvscale_engine.layers.attention import CAUSAL_CHUNK, PagedAttention, SeqSpan, build_metadata

BLOCK = 16


@pytest.mark.parametrize("tokens", [2, CAUSAL_CHUNK, CAUSAL_CHUNK + 1, 3 * CAUSAL_CHUNK - 7, 600])
def test_chunked_causal_prefill_equals_one_causal_call(tokens: int) -> None:
    torch.manual_seed(tokens)
    heads, kv_heads, dim = 8, 2, 64
    q = torch.randn(tokens, heads, dim)
    k, v = torch.randn(tokens, kv_heads, dim), torch.randn(tokens, kv_heads, dim)
    blocks = -(-tokens // BLOCK)
    meta = build_metadata([SeqSpan(0, tokens, list(range(blocks)))], BLOCK, None, q.device)
    (span,) = meta.prefills
    assert len(span.causal_chunks) == (0 if tokens <= CAUSAL_CHUNK else -(-tokens // CAUSAL_CHUNK))
    cache = (torch.zeros(blocks * BLOCK, kv_heads, dim), torch.zeros(blocks * BLOCK, kv_heads, dim))
    got = PagedAttention(heads, kv_heads, dim)(q, k, v, cache, meta)
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(4, 1).transpose(0, 1),
        v.repeat_interleave(4, 1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
