"""Weights: HF parameter names and shapes, seeded random init, and safetensors loading.

Dummy models and the tiny test checkpoints share `init_param`, so `dummy:<dir>` and a checkpoint
written by `write_tiny_checkpoint` into that directory hold the same values, on every device.
A device's random generator would not give that (CUDA's and the CPU's differ for one seed), so the
values come from a counter-based hash: element i of a tensor is a 32-bit hash of (seed, name, i),
computed with exact integer operations on the tensor's own device, turned into a uniform value of
variance 1 exactly, then scaled by one correctly rounded multiply. Every step gives the same bits
on a CPU and a GPU, and it runs where the model lives (no host-side generation of 8B values).
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from kvscale_engine.config import ConfigError
from kvscale_engine.model_config import ModelConfig

Shape = tuple[int, ...]


def param_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    shapes: dict[str, Shape] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
        }
        if cfg.attention_bias:
            shapes |= {
                f"{p}.self_attn.{n}_proj.bias": (s,) for n, s in (("q", q), ("k", kv), ("v", kv))
            }
            if cfg.model_type != "qwen2":
                shapes[f"{p}.self_attn.o_proj.bias"] = (h,)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    return shapes


MASK32 = 0xFFFFFFFF
CHUNK = 1 << 24  # elements hashed at once: int64 temporaries of 128 MiB
UNIT_VARIANCE = math.sqrt(12.0)  # uniform on [-0.5, 0.5) times this has variance 1


def init_param(
    name: str, shape: Shape, seed: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """Seeded per name, so the values do not depend on the order parameters are visited in."""
    numel = math.prod(shape)
    assert numel <= MASK32, f"{name}: {numel} elements exceed the 32-bit counter"
    keys = param_keys(name, seed)
    scale, offset = _scale(name, shape)
    out = torch.empty(numel, dtype=dtype, device=device)
    for start in range(0, numel, CHUNK):
        index = torch.arange(start, min(start + CHUNK, numel), dtype=torch.int64, device=device)
        value = uniform_centered(index, keys) * scale
        if offset:
            value = value + offset
        out[start : start + len(index)] = value.to(dtype)
    return out.view(shape)


def param_keys(name: str, seed: int) -> tuple[int, int]:
    """Two 32-bit keys from the seed and the parameter's name."""
    return zlib.crc32(f"{seed}/{name}".encode()), zlib.crc32(f"{name}/{seed}".encode())


def uniform_centered(index: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """Float32 values on [-0.5, 0.5), a fixed function of (keys, index) computed exactly."""
    h = hash32((index + keys[0]) ^ keys[1])
    return (h >> 8).to(torch.float32) * 2.0**-24 - 0.5  # 24-bit integers: every step exact


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply) on int64 lanes, with no int64 overflow."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x < 2**32, in 16-bit halves of c so no product passes 2**49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK32


def _scale(name: str, shape: Shape) -> tuple[float, float]:
    """Multiplier and offset of a parameter: unit variance, scaled like a trained model's."""
    if name.endswith("norm.weight"):
        return 0.1 * UNIT_VARIANCE, 1.0
    if name.endswith(".bias"):
        return 0.1 * UNIT_VARIANCE, 0.0
    if name == "lm_head.weight":
        return 4.0 / math.sqrt(shape[1]) * UNIT_VARIANCE, 0.0
    if "embed_tokens" in name:
        return UNIT_VARIANCE, 0.0
    return UNIT_VARIANCE / math.sqrt(shape[1]), 0.0


def init_weights(cfg: ModelConfig, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    cpu = torch.device("cpu")
    return {n: init_param(n, s, seed, dtype, cpu) for n, s in param_shapes(cfg).items()}


def iter_checkpoint(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a (possibly sharded) safetensors checkpoint."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors files in {path}")
    for file in files:
        with safe_open(str(path / file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, f.get_tensor(name)
