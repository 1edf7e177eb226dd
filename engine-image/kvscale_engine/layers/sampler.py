"""Token sampling: greedy, temperature, top-k, top-p, with per-request seeds.

Sampling draws Gumbel-style exponential noise (argmax of p / E, E ~ Exp(1)), which is exact
categorical sampling. A seeded request draws from a generator keyed by (seed, output index), so its
tokens do not depend on what else is in the batch or on preemption.
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
        probs = _filtered_probs(logits[rows], chosen)
        noise = _exponential_noise(probs, chosen, generator)
        tokens[rows] = (probs / noise).argmax(dim=-1)
    return [int(t) for t in tokens.tolist()]


def _filtered_probs(logits: torch.Tensor, requests: list[SampleRequest]) -> torch.Tensor:
    temps = torch.tensor([r.params.temperature for r in requests], device=logits.device)
    logits = logits / temps.unsqueeze(1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ks = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in requests])
    rank = torch.arange(vocab).unsqueeze(0)
    sorted_logits[(rank >= ks.unsqueeze(1)).to(logits.device)] = float("-inf")
    top_ps = torch.tensor([r.params.top_p for r in requests], device=logits.device)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_logits[mass_before > top_ps.unsqueeze(1)] = float("-inf")
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
