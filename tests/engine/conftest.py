"""Engine-tier fixtures: a tiny seeded Llama checkpoint, its HF reference, engines."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import HFReference

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.checkpoint import write_tiny_checkpoint
from kvscale_engine.engine.llm_engine import LLMEngine

# bench/gpu_check.sh sets cuda to run this tier on a GPU; HF reference outputs stay on the CPU.
DEVICE = os.environ.get("KVSCALE_TEST_DEVICE", "cpu")
ATTENTION = os.environ.get("KVSCALE_TEST_ATTENTION", "auto")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models run faster on one thread, and shared CI cores do not make threads spin."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("llama"), arch="llama", seed=0)


@pytest.fixture(scope="session")
def hf_llama(llama_dir: Path) -> HFReference:
    return HFReference(llama_dir)


@pytest.fixture
def no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without a C compiler: an empty kernel cache and $CC naming nothing."""
    monkeypatch.setenv("KVSCALE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))


@pytest.fixture
def make_engine(llama_dir: Path) -> Iterator[Callable[..., LLMEngine]]:
    def make(model: str | Path = llama_dir, **overrides: Any) -> LLMEngine:
        settings: dict[str, Any] = {
            "max_model_len": 512,
            "num_kv_blocks": 256,
            "block_size": 16,
            "device": DEVICE,
            "dtype": "float32",  # token-exact comparisons need fp32 on every device
            "attention_backend": ATTENTION,
        }
        return LLMEngine(EngineConfig(model=str(model), **(settings | overrides)))

    yield make
