"""Request mixes for the benchmarks: the Anyscale shape, shared-prefix chats, a public trace."""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass
from pathlib import Path

TRACES = Path(  # the full traces; the tests point KVSCALE_TRACES_DIR at tests/data/traces
    os.environ.get("KVSCALE_TRACES_DIR", Path(__file__).resolve().parents[2] / "shared/data/traces")
)
AZURE_CODE = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int


def anyscale(
    count: int, prompt_len: int, mean_output: float, cap: int, vocab: int, seed: int = 0
) -> list[Request]:
    """Fixed-length prompts, output lengths from a capped exponential (the Anyscale blog shape)."""
    rng = random.Random(seed)
    return [
        Request(
            [rng.randrange(5, vocab) for _ in range(prompt_len)],
            max(1, min(cap, round(rng.expovariate(1 / mean_output)))),
        )
        for _ in range(count)
    ]


def shared_prefix(
    count: int, prefix_len: int, suffix_len: int, max_tokens: int, vocab: int, seed: int = 0
) -> list[Request]:
    """Requests that share one system prompt and differ in a short user turn."""
    rng = random.Random(seed)
    system = [rng.randrange(5, vocab) for _ in range(prefix_len)]
    return [
        Request(system + [rng.randrange(5, vocab) for _ in range(suffix_len)], max_tokens)
        for _ in range(count)
    ]


def azure_trace(
    count: int, max_len: int, vocab: int, seed: int = 0, path: Path = AZURE_CODE, scale: float = 1
) -> list[Request]:
    """A random sample of (prompt, output) lengths from an Azure 2023 trace (heavy-tailed).

    Every prompt is its own random token sequence, so no two requests share a cached prefix.
    `scale` shrinks both lengths (a CPU run keeps the trace's shape at a size it can afford).
    """
    with path.open() as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    rng = random.Random(seed)
    sample = [
        (max(1, round(p * scale)), max(1, round(o * scale))) for p, o in rng.sample(rows, count)
    ]
    return [
        Request([rng.randrange(5, vocab) for _ in range(p)], max(1, min(o, max_len - p)))
        for p, o in sample
        if p < max_len - 1
    ]
