"""`kvscale plan`: a model and a GPU in, a KV budget, engine limits and a replica count out.

Weights are a floor, the KV cache grows per token, and what is left is headroom. From an HF
`config.json` (or a named architecture), the dtype, the GPU's memory, the memory fraction and the
context length: weight bytes, KV bytes per token, KV tokens and blocks, the concurrency that fits
at a context, a recommended `maxNumSeqs`/`maxNumBatchedTokens`, and, with an engine profile, a
request rate and an SLO, the replicas needed (one replica's capacity at the SLO is measured on
the simulator's engine model with the given lengths). Output as a table or as an `LLMEndpoint`
patch (`-o yaml`).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import yaml

from kvscale.api.v1alpha1 import SLOSpec
from kvscale.controllers.feasibility import Feasibility
from kvscale.sim.sizing import (
    ARCHITECTURES,
    DTYPE_BYTES,
    GIB,
    GPUS,
    Budget,
    ModelShape,
    SizingError,
    gpu_memory,
    recommend_limits,
)
from kvscale.tools import tool_parser


@dataclass(frozen=True)
class Plan:
    budget: Budget
    max_model_len: int
    context: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu: str | None
    replica_tokens_per_s: float | None = None
    replica_requests_per_s: float | None = None
    replicas: int | None = None
    rate: float | None = None
    feasibility: Feasibility | None = None

    def rows(self) -> list[tuple[str, str]]:
        b = self.budget
        out = [
            ("model", f"{b.model.name} ({b.model.params / 1e9:.2f} B parameters)"),
            ("weights", f"{b.weight_bytes / GIB:.2f} GiB ({b.weight_bytes:,} bytes)"),
            ("KV bytes per token", f"{b.kv_bytes_per_token:,}"),
            (
                "GPU memory x fraction",
                f"{b.gpus} x {b.gpu_memory_bytes / GIB:.2f} GiB x {b.memory_fraction}",
            ),
            ("activation peak (est.)", f"{b.activation_bytes / GIB:.2f} GiB per GPU"),
            ("KV cache", f"{b.kv_bytes / GIB:.2f} GiB"),
            ("KV blocks", f"{b.blocks:,} of {b.block_size} tokens"),
            ("KV tokens", f"{b.kv_tokens:,}"),
            (
                f"max concurrency at {self.context:,} tokens",
                f"{b.max_concurrency(self.context):.1f}x",
            ),
            (
                f"max concurrency at {self.max_model_len:,} tokens (maxModelLen)",
                f"{b.max_concurrency(self.max_model_len):.2f}x",
            ),
            ("recommended maxNumSeqs", str(self.max_num_seqs)),
            ("recommended maxNumBatchedTokens", str(self.max_num_batched_tokens)),
        ]
        if self.replica_tokens_per_s is not None:
            out.append(
                (
                    "replica capacity at the SLO",
                    f"{self.replica_tokens_per_s:,.0f} tokens/s "
                    f"({self.replica_requests_per_s:.2f} requests/s)",
                )
            )
        if self.replicas is not None:
            out.append((f"replicas for {self.rate} requests/s", str(self.replicas)))
        if self.feasibility is not None:
            out.append(("TTFT SLO", self.feasibility.message()))
        return out

    def patch(self, ttft: float | None, itl: float | None) -> dict[str, Any]:
        b = self.budget
        resources: dict[str, Any] = {"gpusPerReplica": b.gpus}
        if self.gpu:
            resources["gpuType"] = self.gpu
        spec: dict[str, Any] = {
            "model": {"maxModelLen": self.max_model_len},
            "engine": {
                "blockSize": b.block_size,
                "memoryFraction": b.memory_fraction,
                "maxNumSeqs": self.max_num_seqs,
                "maxNumBatchedTokens": self.max_num_batched_tokens,
            },
            "resources": resources,
        }
        if ttft is not None and itl is not None:
            spec["slo"] = {"ttftP99Seconds": ttft, "itlP99Seconds": itl}
        if self.replica_tokens_per_s is not None:
            scaling: dict[str, Any] = {
                "replicaCapacityTokensPerSecond": round(self.replica_tokens_per_s, 1)
            }
            if self.replicas is not None:
                scaling["minReplicas"] = 1
                scaling["maxReplicas"] = max(2 * self.replicas, self.replicas + 2)
            spec["scaling"] = scaling
        return {"apiVersion": "kvscale.io/v1alpha1", "kind": "LLMEndpoint", "spec": spec}


def make_plan(args: argparse.Namespace) -> Plan:
    model = ModelShape.load(args.model)
    memory, _ = gpu_memory(args.gpu, args.gpu_memory_gib)
    max_len = args.max_model_len or model.max_positions
    context = args.context or min(max_len, 2048)
    if context > max_len:
        raise SizingError(f"--context {context} is longer than maxModelLen {max_len}")
    probe = Budget(
        model,
        memory,
        args.gpus,
        args.memory_fraction,
        DTYPE_BYTES[args.dtype],
        DTYPE_BYTES[args.kv_dtype],
        args.block_size,
        8192,
        256,
    )
    if probe.kv_tokens < max_len:
        raise SizingError(
            f"{probe.kv_tokens:,} KV tokens fit, fewer than one {max_len:,}-token sequence: "
            "raise the memory fraction or GPUs, or lower maxModelLen"
        )
    profile = _profile(args)
    seqs, batched = recommend_limits(probe.kv_tokens, context, profile, args.itl_slo)
    budget = replace(probe, max_num_batched_tokens=batched, max_num_seqs=seqs)
    plan = Plan(budget, max_len, context, seqs, batched, args.gpu)
    if profile is None:
        return plan
    return _with_replicas(plan, profile, args)


def _profile(args: argparse.Namespace) -> Any:
    if not args.profile:
        return None
    from kvscale.sim.profile import load_profile

    return load_profile(args.profile)


def _with_replicas(plan: Plan, profile: Any, args: argparse.Namespace) -> Plan:
    from kvscale.sim.arrivals import Shapes
    from kvscale.sim.engine import Limits
    from kvscale.sim.feasibility import assess
    from kvscale.sim.oracle import calibrate
    from kvscale.sim.recorder import Targets

    inp, out = args.input_len, args.output_len
    if inp + out > plan.max_model_len:
        raise SizingError("--input-len + --output-len exceed maxModelLen")
    rng = np.random.default_rng(0)  # lengths spread +-50% around the means, as traces do
    n = 2000
    shapes = Shapes(
        np.zeros(n),
        np.maximum(rng.uniform(0.5, 1.5, n) * inp, 1).astype(np.int64),
        np.maximum(rng.uniform(0.5, 1.5, n) * out, 1).astype(np.int64),
        np.zeros(n, dtype=np.int64),
    )
    limits = Limits(
        plan.max_num_seqs, plan.max_num_batched_tokens, profile.kv_tokens, plan.max_model_len, 30.0
    )
    feasible = assess(profile, limits, shapes, args.ttft_slo, SLOSpec().attainment_target)
    cap = calibrate(profile, limits, Targets(args.ttft_slo, args.itl_slo), shapes)
    replicas = None
    if args.rate is not None and cap.requests_per_s > 0:
        replicas = math.ceil(args.rate * (1 + args.headroom) / cap.requests_per_s)
    return Plan(
        plan.budget,
        plan.max_model_len,
        plan.context,
        plan.max_num_seqs,
        plan.max_num_batched_tokens,
        plan.gpu,
        cap.tokens_per_s,
        cap.requests_per_s,
        replicas,
        args.rate,
        feasible,
    )


def add_plan_parser(sub: Any) -> None:
    summary = "KV budget, engine limits and replicas for a model on a GPU"
    p = tool_parser(sub, "plan", summary, __doc__)
    p.add_argument(
        "--model",
        required=True,
        help=f"config.json, a checkpoint directory, or one of {', '.join(ARCHITECTURES)}",
    )
    p.add_argument("--gpu", default=None, help=f"one of {', '.join(GPUS)}")
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="GPU memory as CUDA reports it (instead of --gpu)",
    )
    p.add_argument("--gpus", type=int, default=1, help="tensor-parallel GPUs per replica")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16")
    p.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), default="bfloat16")
    p.add_argument("--memory-fraction", type=float, default=0.9)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's")
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="typical tokens per sequence for concurrency and maxNumSeqs (default "
        "min(maxModelLen, 2048))",
    )
    p.add_argument("--profile", default=None, help="engine profile (name or JSON) for replicas")
    p.add_argument("--rate", type=float, default=None, help="requests/s to serve")
    p.add_argument("--input-len", type=int, default=1024, help="mean prompt tokens")
    p.add_argument("--output-len", type=int, default=256, help="mean output tokens")
    p.add_argument("--ttft-slo", type=float, default=2.0)
    p.add_argument("--itl-slo", type=float, default=0.2)
    p.add_argument("--headroom", type=float, default=0.2)
    p.add_argument("-o", "--output", choices=("table", "yaml"), default="table")
    p.set_defaults(func=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from kvscale.sim.profile import ProfileError

    try:
        if args.memory_fraction <= 0 or args.memory_fraction > 1:
            raise SizingError("--memory-fraction must be in (0, 1]")
        plan = make_plan(args)
    except (SizingError, ProfileError, OSError) as exc:
        print(f"kvscale plan: {exc}", file=sys.stderr)
        return 2
    if plan.feasibility is not None and not plan.feasibility.feasible:
        print(f"kvscale plan: WARNING: {plan.feasibility.message()}", file=sys.stderr)
    if args.output == "yaml":
        patch = plan.patch(
            args.ttft_slo if args.profile else None, args.itl_slo if args.profile else None
        )
        sys.stdout.write(yaml.safe_dump(patch, sort_keys=False))
        return 0
    rows = plan.rows()
    width = max(len(k) for k, _ in rows)
    sys.stdout.write("".join(f"{k.ljust(width)}  {v}\n" for k, v in rows))
    return 0
