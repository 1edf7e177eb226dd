"""Command-line arguments of an engine replica, per engine kind.

`kind: kvscale` runs our engine (`kvscale-engine serve ...`); `kind: vllm` renders the equivalent
flags of vLLM's OpenAI server (`vllm serve`, the entry point of vLLM's image), so one operator can
scale either. On a GPU vLLM takes `--gpu-memory-utilization`; on CPU (`gpusPerReplica: 0`) its KV
cache is `VLLM_CPU_KVCACHE_SPACE` GiB, `memoryFraction` of the replica's memory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from kvscale.api import rules as api_rules
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
    """HTTP paths: probes on ENGINE_PORT; drain and undrain on ADMIN_PORT (None: no such call).

    `startup_s` bounds the start-up (the startup probe's budget): vLLM loads the weights, compiles
    the model and captures CUDA graphs before it listens at all, minutes on a large checkpoint.
    """

    ready: str
    live: str
    drain: str | None
    undrain: str | None
    startup_s: int


ENDPOINTS = {
    "kvscale": Endpoints("/ready", "/health", "/drain", "/undrain", startup_s=600),
    "vllm": Endpoints("/health", "/health", None, None, startup_s=1200),
}
GIB = 1024**3


HUB_CACHE = f"{MODEL_MOUNT}/hub"  # the Hub's cache layout: models--org--name/snapshots/<commit>


def hub_link(source: api.HuggingFaceSource) -> str:
    """Where the init container links the revision's snapshot: one path per repo and revision,
    so a new revision changes the engine's arguments (and rolls the replicas) and endpoints
    sharing a claim do not clash."""
    repo, revision = (x.replace("/", "--") for x in (source.repo, source.revision))
    return f"{MODEL_MOUNT}/kvscale/{repo}@{revision}"


def model_location(spec: api.LLMEndpointSpec) -> str:
    """Where the engine finds the checkpoint inside its container."""
    source = spec.model.source
    if source.host_path is not None:
        return source.host_path.path
    if source.pvc is not None:
        return f"{MODEL_MOUNT}/{source.pvc.sub_path}".rstrip("/")
    if source.huggingface is not None:
        return hub_link(source.huggingface)
    assert source.dummy is not None
    return f"dummy:{source.dummy.preset}"


def _traffic_classes(spec: api.LLMEndpointSpec) -> str:
    classes = [c.rendered() for c in spec.traffic_classes]
    return json.dumps(classes, separators=(",", ":"))


def _shared_args(spec: api.LLMEndpointSpec, model: str, memory_flag: str | None) -> list[str]:
    """The flags both engines spell alike (vLLM names the memory fraction differently, and takes
    none on CPU)."""
    engine = spec.engine
    memory = [memory_flag, str(engine.memory_fraction)] if memory_flag else []
    return [
        "--model", model,
        "--served-model-name", spec.model.name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--max-model-len", str(spec.model.max_model_len),
        "--block-size", str(engine.block_size),
        *memory,
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
    gpu = spec.resources.gpus_per_replica > 0
    args = [
        *_shared_args(spec, model, "--gpu-memory-utilization" if gpu else None),
        "--tensor-parallel-size", str(max(1, spec.resources.gpus_per_replica)),
    ]  # fmt: skip
    if dummy:
        args += ["--load-format", "dummy"]
    return args


def cpu_kv_cache_gib(spec: api.LLMEndpointSpec) -> int:
    """vLLM's KV cache on CPU: `memoryFraction` of the replica's memory, whole GiB, at least 1."""
    memory = api_rules.quantity_value(spec.resources.memory)
    return max(1, math.floor(memory * spec.engine.memory_fraction / GIB))


def cpu_threads(spec: api.LLMEndpointSpec) -> int:
    """Compute threads of a CPU replica: its whole CPUs, at least 1."""
    return max(1, math.floor(api_rules.quantity_value(spec.resources.cpu)))


def engine_env(spec: api.LLMEndpointSpec) -> list[dict[str, str]]:
    """The engine container's environment.

    A CPU vLLM replica gets its KV space, and threads unbound and as many as its CPU limit: a
    limit is a CFS quota over all of the node's cores, not a cpuset, so vLLM's automatic binding
    would pin every replica on a node to the same core, where a busy one starves the others.
    """
    env = [{"name": "HOME", "value": "/tmp"}]
    if spec.engine.kind == "vllm" and spec.resources.gpus_per_replica == 0:
        env += [
            {"name": "VLLM_CPU_KVCACHE_SPACE", "value": str(cpu_kv_cache_gib(spec))},
            {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"},
            {"name": "OMP_NUM_THREADS", "value": str(cpu_threads(spec))},
        ]
    return env


def engine_args(spec: api.LLMEndpointSpec) -> list[str]:
    base = kvscale_args(spec) if spec.engine.kind == "kvscale" else vllm_args(spec)
    return base + list(spec.engine.extra_args)
