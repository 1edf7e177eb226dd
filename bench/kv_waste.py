"""KV waste: allocated-but-unused KV slots under a heavy-tailed workload, paged vs reservations.

Lengths come from the Azure 2023 code trace (prompt p50 1,469 / p99 7,436 tokens, output p50 13 /
p99 251); every prompt is its own random token sequence, so no prefix-cache hit hides waste, and
the pool holds far less than the trace's demand, so the scheduler preempts. Waste depends only on
lengths and on the block manager, not on model values, so the engine runs with its real
scheduler, block manager and detokenizer and a stub in place of the forward pass (returning a
fixed token). Waste is summed over every step and compared, on the same steps, with two
contiguous reservations per running request:

- `max_model_len` slots (what pre-paged engines reserved);
- exactly prompt + output slots, an oracle that knows every output length in advance (the best a
  contiguous reservation could do).

The targets: a paged cache that allocates on demand leaves at most a partial last
block per sequence unused, so it must waste less than even a perfect reservation, which holds each
request's not-yet-generated tokens for its whole life. An allocator that grabbed blocks ahead
(a watermark, or max_tokens up front) would fail both this and the second target, at most
`block_size - 1` unused slots per running sequence on average.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.harness import make_engine
from bench.workloads import azure_trace
from kvscale_engine.engine.scheduler import ScheduledBatch
from kvscale_engine.model_config import NAMED_ARCHS
from kvscale_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Setup:
    requests: int
    max_model_len: int
    num_kv_blocks: int
    max_num_seqs: int


FULL = Setup(2000, 8192, 8192, 256)
QUICK = Setup(50, 8192, 2048, 16)


def run(quick: bool = False) -> dict[str, Any]:
    p = QUICK if quick else FULL
    engine = make_engine(
        "dummy:llama-tiny",
        max_model_len=p.max_model_len,
        num_kv_blocks=p.num_kv_blocks,
        max_num_seqs=p.max_num_seqs,
        max_num_batched_tokens=8192,
    )
    engine.model_runner.run = _stub_forward  # type: ignore[method-assign]
    vocab = int(NAMED_ARCHS["llama-tiny"]["vocab_size"])
    requests = azure_trace(p.requests, p.max_model_len, vocab)
    final_len: dict[str, int] = {}
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        engine.add_request(str(i), r.prompt, params)
        final_len[str(i)] = len(r.prompt) + r.max_tokens
    allocated = used = reserved = oracle = steps = seq_steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        running = engine.scheduler.running
        allocated += stats.kv_allocated_slots
        used += stats.kv_used_slots
        reserved += len(running) * p.max_model_len
        oracle += sum(final_len[s.request_id] for s in running)
        seq_steps += len(running)
        steps += 1
    waste = allocated - used
    oracle_waste = oracle - used
    return {
        "waste_fraction": round(waste / allocated, 5),
        "waste_vs_oracle_reservation": round(waste / oracle_waste, 4),
        "waste_vs_contiguous_reservation": round(waste / (reserved - used), 5),
        "mean_unused_slots_per_running_sequence": round(waste / seq_steps, 2),
        "target": "waste_vs_oracle_reservation < 1 (paged wastes less than reserving exactly "
        "prompt + output per request) and mean_unused_slots_per_running_sequence <= "
        "block_size - 1 (on-demand allocation leaves at most a partial last block)",
        "oracle_reservation_waste_fraction": round(oracle_waste / oracle, 5),
        "contiguous_reservation_waste_fraction": round((reserved - used) / reserved, 5),
        "slots_summed_over_steps": {
            "used": used,
            "paged_allocated": allocated,
            "oracle_reserved": oracle,
            "contiguous_reserved": reserved,
        },
        "block_size": engine.config.block_size,
        "steps": steps,
        "preemptions": engine.stats().num_preemptions,
        # hits only from preempted requests re-admitted onto their own blocks still cached
        "prefix_cache_hits_tokens": engine.stats().prefix_cache_hits,
        "workload": asdict(p)
        | {
            "trace": "azure-llm-2023 code (Splitwise, CC-BY-4.0)",
            "requests_used": len(requests),
            "prompts": "random tokens per request (no shared prefixes)",
            "demand_tokens": sum(final_len.values()),
            "pool_tokens": p.num_kv_blocks * engine.config.block_size,
        },
    }


def _stub_forward(batch: ScheduledBatch) -> list[int]:
    return [5 for item in batch.seqs if item.samples]
