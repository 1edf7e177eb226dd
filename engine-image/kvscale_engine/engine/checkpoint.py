"""Small seeded HF-format checkpoints: for tests, the e2e cluster and the demo.

The result loads with `transformers.AutoModelForCausalLM.from_pretrained` and with our loader:
`config.json`, `model.safetensors` (or shards plus an index), a byte-level BPE `tokenizer.json`
trained on a built-in text, `tokenizer_config.json` with a chat template, `generation_config.json`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from kvscale_engine.engine.tokenizer import BOS, EOS, build_tokenizer
from kvscale_engine.engine.weights import init_weights
from kvscale_engine.model_config import NAMED_ARCHS, ModelConfig

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
ARCH_DEFAULTS = {"llama": {}, "mistral": {"sliding_window": 4096}, "qwen2": {}}
# vLLM's CPU attention refuses the tests' head_dim 16; these sizes give head_dim 64 (the
# checkpoint vLLM replicas serve on the local cluster, manifests/samples/vllm-cpu.yaml)
VLLM_CPU_SIZES = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def write_tiny_checkpoint(
    path: str | Path,
    arch: str = "llama",
    seed: int = 0,
    num_shards: int = 1,
    **sizes: Any,
) -> Path:
    """Write a seeded checkpoint; `sizes` override config.json fields (e.g. hidden_size=128)."""
    if arch not in ARCH_DEFAULTS:
        raise ValueError(f"arch must be one of {', '.join(ARCH_DEFAULTS)}, got {arch!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(min(int(sizes.get("vocab_size", 512)), 512))
    tokenizer.save(str(path / "tokenizer.json"))
    raw = _config_dict(arch, tokenizer, sizes)
    _write_json(path / "config.json", raw)
    _write_weights(path, init_weights(ModelConfig.from_dict(raw), seed, torch.float32), num_shards)
    _write_json(path / "tokenizer_config.json", _tokenizer_config(raw))
    _write_json(
        path / "generation_config.json",
        {"bos_token_id": raw["bos_token_id"], "eos_token_id": raw["eos_token_id"]},
    )
    return path


def _config_dict(arch: str, tokenizer: Tokenizer, sizes: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {**NAMED_ARCHS["llama-tiny"], **ARCH_DEFAULTS[arch], **sizes}
    raw["vocab_size"] = max(int(raw["vocab_size"]), tokenizer.get_vocab_size())
    theta = raw.pop("rope_theta", 10000.0)
    scaling = raw.pop("rope_scaling", None) or {"rope_type": "default"}
    raw["rope_parameters"] = {**scaling, "rope_theta": theta}
    raw["rope_theta"] = theta  # transformers 4.x reads this field
    if scaling.get("rope_type") != "default":
        raw["rope_scaling"] = scaling
    if arch == "qwen2":
        raw["use_sliding_window"] = False
    return {
        **raw,
        "model_type": arch,
        "architectures": [f"{arch.capitalize()}ForCausalLM"],
        "hidden_act": "silu",
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(EOS),
        "torch_dtype": "float32",
    }


def _tokenizer_config(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": raw["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }


def _save(tensors: dict[str, torch.Tensor], file: Path) -> None:
    # safetensors writes 0600; a checkpoint is read by engine pods running as another user
    save_file(tensors, str(file), metadata={"format": "pt"})
    file.chmod(0o644)


def _write_weights(path: Path, tensors: dict[str, torch.Tensor], num_shards: int) -> None:
    if num_shards <= 1:
        _save(tensors, path / "model.safetensors")
        return
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for shard in range(num_shards):
        file = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[shard::num_shards]}
        _save(part, path / file)
        weight_map |= dict.fromkeys(part, file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _write_json(path / "model.safetensors.index.json", index)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
