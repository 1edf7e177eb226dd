"""Command-line arguments of an engine replica, per engine kind.

`kind: kvscale` runs our engine (`kvscale-engine serve ...`); `kind: vllm` renders the equivalent
flags of vLLM's OpenAI server, so one operator can scale either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvscale.api import v1alpha1 as api

ENGINE_PORT = 8000  # the OpenAI API, /ready, /health, /metrics (the Service's port)
ADMIN_PORT = 8001  # the engine's /drain, /undrain: never behind a Service
# The admin port's contract (pod IP only, no auth):
#   POST /drain          readiness false, new requests 503; answers at once (idempotent)
#   POST /drain?wait=S   the same, answering once in-flight reached 0 or after S seconds
#   GET  /drain          changes nothing; what to poll
#   POST /undrain        cancels a drain (an aborted scale-in); 409 once the pod got SIGTERM
# Each answers 200 with {"draining": bool, "in_flight": int (admitted or queued, unfinished),
# "queued": int, "drained": bool (draining and in_flight == 0), "phase": str}.
MODEL_MOUNT = "/models"
DRAIN_SECONDS = 30
# after SIGTERM the engine still serves this long (readiness false) while endpoints update, then
# drains for up to DRAIN_SECONDS; the pod's termination grace period covers both. ADMIN_PORT and
# this are the engine's defaults (--admin-port, --shutdown-grace; a test checks they agree).
SHUTDOWN_GRACE_SECONDS = 5


@dataclass(frozen=True)
class Endpoints:
    """HTTP paths: probes on ENGINE_PORT; drain and undrain on ADMIN_PORT (None: no such call)."""

    ready: str
    live: str
    drain: str | None
    undrain: str | None


ENDPOINTS = {
    "kvscale": Endpoints(ready="/ready", live="/health", drain="/drain", undrain="/undrain"),
    "vllm": Endpoints(ready="/health", live="/health", drain=None, undrain=None),
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
        "--admin-port", str(ADMIN_PORT),
        "--shutdown-grace", str(SHUTDOWN_GRACE_SECONDS),
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
