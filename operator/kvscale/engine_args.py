"""Command-line arguments of an engine replica, per engine kind.

`kind: kvscale` runs our engine (`kvscale-engine serve ...`); `kind: vllm` renders the equivalent
flags of vLLM's OpenAI server, so one operator can scale either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvscale.api import v1alpha1 as api

ENGINE_PORT = 8000
MODEL_MOUNT = "/models"
DRAIN_SECONDS = 30


@dataclass(frozen=True)
class Endpoints:
    """HTTP paths the kubelet probes; `drain` is called by the preStop hook when there is one."""

    ready: str
    live: str
    drain: str | None


ENDPOINTS = {
    "kvscale": Endpoints(ready="/ready", live="/health", drain="/drain"),
    "vllm": Endpoints(ready="/health", live="/health", drain=None),
}


def model_location(spec: api.LLMEndpointSpec) -> str:
    """Where the engine finds the checkpoint inside its container."""
    source = spec.model.source
    if source.host_path is not None:
        return source.host_path.path
    if source.pvc is not None:
        return f"{MODEL_MOUNT}/{source.pvc.sub_path}".rstrip("/")
    assert source.dummy is not None
    return f"dummy:{source.dummy.preset}"


def _traffic_classes(spec: api.LLMEndpointSpec) -> str:
    classes = [c.model_dump(by_alias=True) for c in spec.traffic_classes]
    return json.dumps(classes, separators=(",", ":"))


def _shared_args(spec: api.LLMEndpointSpec, model: str, memory_flag: str) -> list[str]:
    """The flags both engines spell alike (vLLM names the memory fraction differently)."""
    engine = spec.engine
    return [
        "--model", model,
        "--served-model-name", spec.model.name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--max-model-len", str(spec.model.max_model_len),
        "--block-size", str(engine.block_size),
        memory_flag, str(engine.memory_fraction),
        "--max-num-seqs", str(engine.max_num_seqs),
        "--max-num-batched-tokens", str(engine.max_num_batched_tokens),
        "--enable-prefix-caching" if engine.enable_prefix_caching
        else "--no-enable-prefix-caching",
    ]  # fmt: skip


def kvscale_args(spec: api.LLMEndpointSpec) -> list[str]:
    args = [
        "serve",
        *_shared_args(spec, model_location(spec), "--memory-fraction"),
        "--drain-timeout", str(DRAIN_SECONDS),
    ]  # fmt: skip
    if spec.traffic_classes:
        args += ["--traffic-classes", _traffic_classes(spec)]
    return args


def vllm_args(spec: api.LLMEndpointSpec) -> list[str]:
    dummy = spec.model.source.dummy is not None
    # vLLM reads the architecture from the named model's config even for dummy weights
    model = spec.model.name if dummy else model_location(spec)
    args = [
        *_shared_args(spec, model, "--gpu-memory-utilization"),
        "--tensor-parallel-size", str(max(1, spec.resources.gpus_per_replica)),
    ]  # fmt: skip
    if dummy:
        args += ["--load-format", "dummy"]
    return args


def engine_args(spec: api.LLMEndpointSpec) -> list[str]:
    base = kvscale_args(spec) if spec.engine.kind == "kvscale" else vllm_args(spec)
    return base + list(spec.engine.extra_args)
