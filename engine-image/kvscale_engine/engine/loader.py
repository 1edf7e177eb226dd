"""Build the model on its device and fill it: from a checkpoint directory, or seeded (dummy)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvscale_engine.config import ConfigError, EngineConfig
from kvscale_engine.engine.weights import init_param, iter_checkpoint
from kvscale_engine.model_config import ModelConfig
from kvscale_engine.models.llama import LlamaForCausalLM

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(
    config: EngineConfig, model_cfg: ModelConfig, device: torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    with _default_dtype(dtype), device:
        model = LlamaForCausalLM(model_cfg, max_positions=config.max_model_len)
    if config.is_dummy:
        _fill_dummy(model, config.seed, dtype, device)
    else:
        _fill_from_checkpoint(model, config.model_source)
    return model.eval()


@torch.no_grad()
def _fill_dummy(
    model: LlamaForCausalLM, seed: int, dtype: torch.dtype, device: torch.device
) -> None:
    for name, param in model.named_parameters():
        param.copy_(init_param(name, tuple(param.shape), seed, dtype, device))


@torch.no_grad()
def _fill_from_checkpoint(model: LlamaForCausalLM, path: str) -> None:
    params = dict(model.named_parameters())
    missing = set(params)
    for name, tensor in iter_checkpoint(path):
        if name not in params:
            if name == "lm_head.weight" or name.endswith(IGNORED_SUFFIXES):
                continue  # tied embeddings, or buffers we recompute
            raise ConfigError(f"checkpoint tensor {name!r} has no place in the model")
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise ConfigError(
                f"{name}: checkpoint shape {tuple(tensor.shape)} "
                f"!= model shape {tuple(params[name].shape)}"
            )
        params[name].copy_(tensor)
        missing.discard(name)
    if missing:
        raise ConfigError(f"checkpoint {path} lacks {len(missing)} tensors, e.g. {min(missing)}")


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
