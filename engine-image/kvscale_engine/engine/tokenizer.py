"""Text <-> token ids through the `tokenizers` library, plus the checkpoint's chat template."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from kvscale_engine.config import EngineConfig

Message = Mapping[str, Any]
# the built-in tokenizer of dummy models and of the tiny test checkpoints (checkpoint.py)
BOS, EOS = "<s>", "</s>"
SPECIAL_TOKENS = [BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>"]
TRAINING_TEXT = """\
Batching, caching and concurrency all spend one currency: KV-cache memory. The weights are a fixed
floor, the cache grows per token per request, and headroom absorbs bursts. A paged cache hands out
fixed-size blocks; a scheduler admits requests while blocks and the token budget last; a prefix
cache lets requests that share a system prompt skip its prefill. The quick brown fox jumps over the
lazy dog. Hello, world! How are you today? I am fine, thank you. What is the capital of France?
Paris is the capital of France. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. def main(): return 42
"""


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        eos_token_id: int | None,
        chat_template: str | None = None,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        special = {k: _token_text(config[k]) for k in ("bos_token", "eos_token") if config.get(k)}
        eos_id = _eos_from_generation_config(path / "generation_config.json")
        if eos_id is None and "eos_token" in special:
            eos_id = backend.token_to_id(special["eos_token"])
        return cls(backend, eos_id, _chat_template(path, config), special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        known = [t for t in token_ids if 0 <= t < self.vocab_size]  # dummy models overshoot
        text: str = self.backend.decode(known, skip_special_tokens=skip_special_tokens)
        return text

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        template = env.from_string(self.chat_template)
        rendered: str = template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
        )
        return rendered


def load_tokenizer(config: EngineConfig) -> Tokenizer:
    """The checkpoint's tokenizer; dummy architectures get the built-in byte-level BPE."""
    source = Path(config.model_source)
    if (source / "tokenizer.json").exists():
        return Tokenizer.from_dir(source)
    backend = build_tokenizer()
    return Tokenizer(backend, backend.token_to_id(EOS), None, {"eos_token": EOS})


def build_tokenizer(vocab_size: int = 512) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    return tok


def _chat_template(path: Path, config: dict[str, Any]) -> str | None:
    """From tokenizer_config.json (a string or a list of named ones) or chat_template.jinja."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    return None if template is None else str(template)


def _raise_template_error(message: str) -> None:
    raise ValueError(message)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _token_text(value: Any) -> str:
    return str(value["content"]) if isinstance(value, dict) else str(value)


def _eos_from_generation_config(path: Path) -> int | None:
    eos = _read_json(path).get("eos_token_id")
    if isinstance(eos, list):
        return int(eos[0]) if eos else None
    return None if eos is None else int(eos)
