"""The Llama-family decoder (Llama, Mistral, Qwen2): RMSNorm, RoPE, GQA, SwiGLU.

Parameter names match Hugging Face checkpoints, so loading is a plain `load_state_dict`. The
forward pass works on a flattened batch of tokens from many sequences; attention finds each
sequence's context through the paged KV cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kvscale_engine.layers.attention import AttentionMetadata, PagedAttention
from kvscale_engine.layers.cpu_ops import CpuOps
from kvscale_engine.layers.rotary import Rope, RotaryEmbedding, rotate
from kvscale_engine.model_config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]
Fuse = Callable[[Sequence[nn.Linear]], nn.Module]  # linears reading one input -> one module


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.cpu_ops: CpuOps | None = None  # set by use_cpu_ops()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_ops is not None:
            return self.cpu_ops.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        bias, o_bias = cfg.attention_bias, cfg.attention_bias and cfg.model_type != "qwen2"
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=o_bias)
        self.attn = PagedAttention(self.heads, self.kv_heads, self.head_dim)
        self.qkv_proj: nn.Module | None = None  # set by fuse()
        self.cpu_ops: CpuOps | None = None  # set by use_cpu_ops()
        kv = self.kv_heads * self.head_dim
        self.qkv_sizes = (self.heads * self.head_dim, kv, kv)  # qkv_proj's output, split

    def fuse(self, make: Fuse) -> None:
        """q, k and v as one projection over their concatenated weights (made by `make`)."""
        self.qkv_proj = make([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope,
        cache: KVCache,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every row's K and V go to the cache; the output only for `rows` when given."""
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split(self.qkv_sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(-1, self.heads, self.head_dim)
        k = k.view(-1, self.kv_heads, self.head_dim)
        v = v.view(-1, self.kv_heads, self.head_dim)
        if self.cpu_ops is not None:  # in place: q and k are this step's fresh projections
            for t in (q, k):
                self.cpu_ops.rope_(t, *rope)
        else:
            q, k = rotate(rope, q, k)
        if rows is not None:
            q = q.index_select(0, rows)
        o = self.attn(q, k, v, cache, meta)
        out: torch.Tensor = self.o_proj(o.reshape(-1, self.heads * self.head_dim))
        return out


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.gate_up_proj: nn.Module | None = None  # set by fuse()

    def fuse(self, make: Fuse) -> None:
        """gate and up as one projection over their concatenated weights (made by `make`)."""
        self.gate_up_proj = make([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        rope: Rope,
        cache: KVCache,
        meta: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`rows`: only these rows' outputs (every row's K/V is still cached)."""
        attended = self.self_attn(self.input_layernorm(x), rope, cache, meta, rows)
        h: torch.Tensor = (x if rows is None else x.index_select(0, rows)) + attended
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, max_positions, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states of every row; of `meta.last_layer.rows` only when the step set them."""
        x = self.embed_tokens(input_ids)
        rope = self.rotary.at(positions, x.dtype)  # once a step, not once a layer
        last = meta.last_layer
        for n, (layer, cache) in enumerate(zip(self.layers, caches, strict=True)):
            if last is not None and n == len(self.layers) - 1:
                x = layer(x, rope, cache, last.meta, last.rows)
            else:
                x = layer(x, rope, cache, meta)
        return self.norm(x)  # type: ignore[no-any-return]


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg, max_positions)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, caches, meta)  # type: ignore[no-any-return]

    def fuse_projections(self, make: Fuse) -> None:
        """Each layer's q/k/v and gate/up as one projection apiece (after the weights loaded)."""
        for module in self.modules():
            if isinstance(module, (Attention, MLP)):
                module.fuse(make)

    def use_cpu_ops(self, ops: CpuOps) -> None:
        """RMSNorm, the rotary embedding and the KV cache write as one C call each (fp32 on the
        CPU)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, PagedAttention)):
                module.cpu_ops = ops

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.tie_word_embeddings:
            return F.linear(hidden, self.model.embed_tokens.weight)
        return self.lm_head(hidden)  # type: ignore[no-any-return]
