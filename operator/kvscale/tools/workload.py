"""Turn request shapes into a timed plan: arrival offsets, prompts, output lengths, classes.

Arrivals are Poisson (burstiness 1), gamma with a burstiness factor (below 1 is burstier, as in
`vllm bench serve`), or replayed from the trace's own timestamps with a time-scale factor.
Prompts are token ids by default, so that input lengths are exact for any model without its
tokenizer; Mooncake's prefix-block hash ids become identical token blocks, i.e. real shared
prefixes for the server's prefix cache.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvscale.traces import TraceError, TraceRequest

MOONCAKE_TICK_S = 3.0  # the trace's timestamps are quantised to ~3 s ticks
WORDS = [
    "cache",
    "block",
    "token",
    "batch",
    "queue",
    "prefix",
    "memory",
    "budget",
    "replica",
    "latency",
    "request",
    "stream",
    "model",
    "engine",
    "scale",
    "router",
    "signal",
    "decode",
    "prefill",
    "window",
    "burst",
]


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    at_s: float  # offset from the start of the run
    prompt: list[int] | str
    input_len: int
    output_len: int
    traffic_class: str | None


def gamma_arrivals(count: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Offsets of `count` arrivals at `rate` req/s; gamma gaps with shape `burstiness`."""
    if burstiness <= 0:
        raise TraceError("burstiness must be positive")
    if math.isinf(rate):
        return [0.0] * count
    if rate <= 0:
        raise TraceError("request rate must be positive (or inf)")
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets


def replay_arrivals(
    rows: Sequence[TraceRequest], time_scale: float, jitter_s: float, rng: random.Random
) -> list[float]:
    """The trace's own arrival times, compressed by time_scale, jittered within a tick."""
    if time_scale <= 0:
        raise TraceError("time scale must be positive")
    times = [r.arrival_s for r in rows]
    if any(t is None for t in times):
        raise TraceError("this workload has no timestamps to replay")
    start = min(t for t in times if t is not None)
    offsets = [((t or 0.0) - start + rng.uniform(0.0, jitter_s)) / time_scale for t in times]
    return sorted(offsets)


def token_prompt(
    req: TraceRequest, vocab: tuple[int, int], seed: int, rng: random.Random
) -> list[int]:
    """input_len token ids: a fixed block per prefix hash id, then tokens unique to the request."""
    low, high = vocab
    ids: list[int] = []
    for block in req.prefix_blocks:
        if len(ids) >= req.input_len:
            break
        block_rng = random.Random(f"{seed}/{block}")
        ids.extend(block_rng.randrange(low, high) for _ in range(req.block_tokens))
    ids = ids[: req.input_len]
    ids.extend(rng.randrange(low, high) for _ in range(req.input_len - len(ids)))
    return ids


def text_prompt(req: TraceRequest, seed: int, rng: random.Random) -> str:
    """About input_len tokens of words (exact counts depend on the model's tokenizer)."""
    words: list[str] = []
    for block in req.prefix_blocks:
        block_rng = random.Random(f"{seed}/{block}")
        words.extend(block_rng.choice(WORDS) for _ in range(req.block_tokens))
    words = words[: req.input_len]
    words.extend(rng.choice(WORDS) for _ in range(req.input_len - len(words)))
    return " ".join(words)


def parse_class_mix(text: str | None) -> list[tuple[str, float]]:
    """'interactive:0.7,batch:0.3' -> weights; None or '' -> no class header."""
    if not text:
        return []
    mix: list[tuple[str, float]] = []
    for part in text.split(","):
        name, _, weight = part.partition(":")
        try:
            value = float(weight) if weight else 1.0
        except ValueError as exc:
            raise TraceError(f"bad class weight in {part!r}") from exc
        if not name.strip() or value <= 0:
            raise TraceError(f"bad class in {part!r}: need name:positive-weight")
        mix.append((name.strip(), value))
    return mix


def plan(
    rows: Sequence[TraceRequest],
    arrivals: Sequence[float],
    *,
    prompt_format: str,
    vocab: tuple[int, int],
    classes: Sequence[tuple[str, float]],
    seed: int,
) -> list[PlannedRequest]:
    if len(rows) != len(arrivals):
        raise TraceError("one arrival per request")
    if prompt_format not in ("ids", "text"):
        raise TraceError("prompt format must be ids or text")
    if not 0 <= vocab[0] < vocab[1]:
        raise TraceError("token id range must be non-empty")
    rng = random.Random(seed)
    names = [c for c, _ in classes]
    weights = [w for _, w in classes]
    planned = []
    for index, (req, at) in enumerate(zip(rows, arrivals, strict=True)):
        prompt: list[int] | str = (
            token_prompt(req, vocab, seed, rng)
            if prompt_format == "ids"
            else text_prompt(req, seed, rng)
        )
        cls = rng.choices(names, weights)[0] if names else None
        planned.append(PlannedRequest(index, at, prompt, req.input_len, req.output_len, cls))
    return planned
