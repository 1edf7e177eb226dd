"""KV waste: allocated-but-unused KV slots under a heavy-tailed workload.

Lengths come from the Azure 2023 code trace (prompt p50 1,469 / p99 7,436 tokens, output p50 13 /
p99 251). Waste depends only on lengths and on the block manager, not on model values, so the
engine runs with its real scheduler, block manager and detokenizer and a stub in place of the
forward pass (returning a fixed token). Waste is summed over every step, and compared with what
reserving max_model_len contiguous slots per request (pre-paged engines) would leave unused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.harness import make_engine
from bench.workloads import azure_trace
from kvscale_engine.sampling_params import SamplingParams
from kvscale_engine.scheduler import ScheduledBatch


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
    requests = azure_trace(p.requests, p.max_model_len)
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        engine.add_request(str(i), r.prompt, params)
    allocated = used = reserved = steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        allocated += stats.kv_allocated_slots
        used += stats.kv_used_slots
        reserved += stats.num_running * p.max_model_len
        steps += 1
    return {
        "waste_fraction": round((allocated - used) / allocated, 5),
        "target": "waste_fraction <= 0.04",
        "contiguous_reservation_waste_fraction": round((reserved - used) / reserved, 5),
        "block_size": engine.config.block_size,
        "steps": steps,
        "preemptions": engine.stats().num_preemptions,
        "workload": asdict(p)
        | {"trace": "azure-llm-2023 code (Splitwise, CC-BY-4.0)", "requests_used": len(requests)},
    }


def _stub_forward(batch: ScheduledBatch) -> list[int]:
    return [5 for item in batch.seqs if item.samples]
