# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Paged-attention decode in Triton: each query reads its K/V straight through its block table.

The reference decode gathers every sequence's context into a padded [batch, ctx, kv_heads, dim]
copy and runs SDPA over it; on a GPU that copy and SDPA's host overhead dominate a decode step.
Here one program handles one (sequence, KV head) pair: it walks the sequence's blocks, loads each
block's K/V rows from the flat cache, and keeps an online softmax for the query heads that share
the KV head (GQA). Context lengths are read from a device tensor, so a launch has no host-side
shape that depends on them and a CUDA graph can replay it.

Used for decode on CUDA; the CPU engine keeps the reference attention. Tests run the kernel on CPU
tensors under Triton's interpreter (TRITON_INTERPRET=1, set before this module is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [batch, heads, dim]
    k_ptr,  # [slots, kv_heads, dim]
    v_ptr,
    out_ptr,  # [batch, heads, dim]
    tables_ptr,  # [batch, max_blocks]
    lens_ptr,  # [batch]
    scale,
    window,  # 0: no sliding window
    stride_qb, stride_qh,
    stride_ks, stride_kh,
    stride_vs, stride_vh,
    stride_ob, stride_oh,
    stride_tb,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    heads = kv_head * GROUP + tl.arange(0, GROUP_PAD)
    head_ok = tl.arange(0, GROUP_PAD) < GROUP
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
        mask=head_ok[:, None] & dim_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    ctx = tl.load(lens_ptr + seq)
    first = 0
    if window > 0:
        first = tl.maximum(ctx - window, 0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    offsets = tl.arange(0, BLOCK_SIZE)
    for b in range(first // BLOCK_SIZE, tl.cdiv(ctx, BLOCK_SIZE)):
        block = tl.load(tables_ptr + seq * stride_tb + b).to(tl.int64)
        pos = b * BLOCK_SIZE + offsets
        live = (pos < ctx) & (pos >= first)
        slots = block * BLOCK_SIZE + offsets
        kv_mask = live[:, None] & dim_ok[None, :]
        k = tl.load(
            k_ptr + slots[:, None] * stride_ks + kv_head * stride_kh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_ptr + slots[:, None] * stride_vs + kv_head * stride_vh + dims[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        p = tl.exp(scores - m_new[:, None])
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / total[:, None]
    tl.store(
        out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & dim_ok[None, :],
    )


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q: [batch, heads, dim]; caches: [slots, kv_heads, dim]; block_tables: [batch, max_blocks];
    context_lens: [batch], each >= 1, counting the token being decoded. Returns q's shape."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    assert heads % kv_heads == 0, f"{heads} query heads over {kv_heads} KV heads"
    assert k_cache.stride(2) == 1 and v_cache.stride(2) == 1 and q.stride(2) == 1
    group = heads // kv_heads
    out = torch.empty_like(q)
    _paged_decode_kernel[(batch, kv_heads)](
        q, k_cache, v_cache, out, block_tables, context_lens, scale, window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        out.stride(0), out.stride(1),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group),
        HEAD_DIM=dim, DIM_PAD=triton.next_power_of_2(dim),
        BLOCK_SIZE=block_size,
    )  # fmt: skip
    return out
