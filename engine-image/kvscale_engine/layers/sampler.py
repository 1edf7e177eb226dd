"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeds.

Sampling draws Gumbel-style exponential noise (argmax of p / E, E ~ Exp(1)), which is exact
categorical sampling. A seeded request draws from a generator keyed by (seed, output index), so its
tokens do not depend on what else is in the batch or on preemption.

Everything stays on the device until the sampled ids are read back, once: per-request settings
travel in pinned, non-blocking copies, and masks are applied with `masked_fill`, not boolean
indexing (which would read a count back), so the host queues the whole step without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscale_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleRequest:
    params: SamplingParams
    output_index: int  # how many tokens the sequence has produced so far


def sample(
    logits: torch.Tensor, requests: list[SampleRequest], generator: torch.Generator
) -> list[int]:
    """logits: [rows, vocab] float32, one row per request."""
    tokens = logits.argmax(dim=-1)
    rows = [i for i, r in enumerate(requests) if not r.params.greedy]
    if rows:
        chosen = [requests[i] for i in rows]
        index = to_device(rows, torch.long, logits.device)
        probs = _filtered_probs(logits.index_select(0, index), chosen)
        noise = _exponential_noise(probs, chosen, generator)
        tokens = tokens.index_copy(0, index, (probs / noise).argmax(dim=-1))
    return [int(t) for t in tokens.tolist()]  # the step's one read-back


def to_device(
    values: list[int] | list[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A small host list on the device without waiting for the device (pinned on CUDA)."""
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _filtered_probs(logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    device, vocab = logits.device, logits.shape[-1]
    temps = to_device([r.params.temperature for r in requests], torch.float32, device)
    ks = to_device(
        [r.params.top_k if r.params.top_k > 0 else vocab for r in requests], torch.long, device
    )
    top_ps = to_device([r.params.top_p for r in requests], torch.float32, device)
    logits = logits / temps.unsqueeze(1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(rank >= ks.unsqueeze(1), float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_logits = sorted_logits.masked_fill(mass_before > top_ps.unsqueeze(1), float("-inf"))
    filtered = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return filtered.softmax(dim=-1)


def _exponential_noise(
    probs: torch.Tensor, requests: list[SampleRequest], generator: torch.Generator
) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for row, r in enumerate(requests):
        if r.params.seed is not None:
            g = torch.Generator(device=probs.device)
            g.manual_seed((r.params.seed * 1_000_003 + r.output_index) % (2**63))
            noise[row].exponential_(generator=g)
    return noise
