"""Rendering of the endpoint's children: deterministic, owned, secure and complete."""

from typing import Any

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.children import engine
from kvscale.children.engine_args import engine_args, engine_env
from kvscale_cluster.specs import HOST_PATH_MODEL, llm_spec

OWNER = engine.Owner("chat", "team-a", "uid-1")


def spec(**extra: Any) -> LLMEndpointSpec:
    return llm_spec(model=HOST_PATH_MODEL, **extra)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return c


def test_render_is_deterministic() -> None:
    assert engine.render(OWNER, spec(), 2) == engine.render(OWNER, spec(), 2)


def test_every_child_is_owned_and_labelled() -> None:
    for obj in engine.render(OWNER, spec(), 1):
        meta = obj["metadata"]
        assert meta["name"] == "chat-engine" and meta["namespace"] == "team-a"
        assert meta["ownerReferences"][0]["uid"] == "uid-1"
        assert meta["ownerReferences"][0]["controller"] is True
        assert meta["labels"]["kvscale.io/endpoint"] == "chat"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "kvscale"


def test_deployment_requests_gpus_and_is_locked_down() -> None:
    dep = engine.engine_deployment(OWNER, spec(resources={"gpusPerReplica": 2}), 3)
    assert dep["spec"]["replicas"] == 3
    c = container(dep)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "2"
    sc = c["securityContext"]
    assert (
        sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    )
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "lifecycle" not in c  # SIGTERM drains; a preStop httpGet could only GET
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(c["args"][c["args"].index("--drain-timeout") + 1])
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    pod = dep["spec"]["template"]["spec"]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {"name": "model", "mountPath": "/models/llama", "readOnly": True} in c["volumeMounts"]


def test_cpu_only_endpoint_asks_for_no_gpu() -> None:
    c = container(engine.engine_deployment(OWNER, spec(resources={"gpusPerReplica": 0}), 1))
    assert "nvidia.com/gpu" not in c["resources"]["limits"]


def test_gpu_type_becomes_a_node_selector() -> None:
    dep = engine.engine_deployment(OWNER, spec(resources={"gpuType": "NVIDIA-H100"}), 1)
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100"
    }


def test_engine_args_follow_the_engine_config() -> None:
    s = spec(
        engine={"blockSize": 32, "enablePrefixCaching": False, "extraArgs": ["--seed", "7"]},
        trafficClasses=[{"name": "interactive", "priority": 10, "maxQueueWaitSeconds": 2}],
    )
    args = engine_args(s)
    assert args[:3] == ["serve", "--model", "/models/llama"]
    assert args[args.index("--block-size") + 1] == "32"
    assert "--no-enable-prefix-caching" in args
    assert args[-2:] == ["--seed", "7"]
    assert '"name":"interactive"' in args[args.index("--traffic-classes") + 1]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_vllm_replicas_run_vllms_image_with_the_specs_flags() -> None:
    engine_config = {
        "kind": "vllm", "blockSize": 32, "maxNumSeqs": 12, "maxNumBatchedTokens": 1024,
        "enablePrefixCaching": False, "memoryFraction": 0.85, "extraArgs": ["--seed", "7"],
    }  # fmt: skip
    s = spec(engine=engine_config, resources={"gpusPerReplica": 1})
    c = container(engine.engine_deployment(OWNER, s, 1))
    assert c["image"] == "vllm/vllm-openai:v0.32.0" and "command" not in c  # `vllm serve`
    args = c["args"]
    assert args[:2] == ["--model", "/models/llama"] and "serve" not in args
    assert _flag(args, "--served-model-name") == "llama-8b"
    assert _flag(args, "--max-model-len") == "4096"
    assert _flag(args, "--block-size") == "32"
    assert _flag(args, "--max-num-seqs") == "12"
    assert _flag(args, "--max-num-batched-tokens") == "1024"
    assert _flag(args, "--gpu-memory-utilization") == "0.85"
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args
    assert "--drain-timeout" not in args and "--admin-port" not in args  # kvscale's own
    assert args[-2:] == ["--seed", "7"]
    assert "VLLM_CPU_KVCACHE_SPACE" not in {e["name"] for e in c["env"]}
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "lifecycle" not in c
    own = spec(engine={"kind": "vllm", "image": "registry.local/vllm/vllm-openai:v0.11.0"})
    assert container(engine.engine_deployment(OWNER, own, 1))["image"].endswith(":v0.11.0")


def test_vllm_on_cpu_gets_its_kv_space_from_memory_not_a_gpu_fraction() -> None:
    s = spec(
        engine={"kind": "vllm", "memoryFraction": 0.25, "enablePrefixCaching": True},
        resources={"gpusPerReplica": 0, "memory": "6Gi"},
    )
    c = container(engine.engine_deployment(OWNER, s, 1))
    assert "--gpu-memory-utilization" not in c["args"] and "--enable-prefix-caching" in c["args"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # a quarter of 6 GiB, whole GiB
    # replicas share a node's cores (a limit is a quota, not a cpuset): no binding to core 0
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "2"
    tiny = spec(
        engine={"kind": "vllm", "memoryFraction": 0.1},
        resources={"gpusPerReplica": 0, "cpu": "500m"},
    )
    tiny_env = {e["name"]: e["value"] for e in engine_env(tiny)}
    assert tiny_env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # 0.8 GiB, at least 1
    assert tiny_env["OMP_NUM_THREADS"] == "1"  # half a CPU, at least one thread
    big = spec(engine={"kind": "vllm"}, resources={"gpusPerReplica": 0, "memory": "64G"})
    assert engine_env(big)[1]["value"] == "53"  # 0.9 of 64e9 bytes is 53.6 GiB
    kvscale_cpu = spec(resources={"gpusPerReplica": 0})
    assert engine_env(kvscale_cpu) == [{"name": "HOME", "value": "/tmp"}]


def test_a_compiling_replica_is_not_killed_and_vllm_gets_shared_memory() -> None:
    kvscale_pod = engine.engine_deployment(OWNER, spec(), 1)["spec"]["template"]["spec"]
    vllm_pod = engine.engine_deployment(OWNER, spec(engine={"kind": "vllm"}), 1)
    pod = vllm_pod["spec"]["template"]["spec"]
    for p, minutes in ((kvscale_pod, 10), (pod, 20)):
        startup = p["containers"][0]["startupProbe"]
        assert startup["httpGet"]["path"] == "/health"
        assert startup["periodSeconds"] * startup["failureThreshold"] == minutes * 60
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}}
    assert shm in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    assert all(v["name"] != "dshm" for v in kvscale_pod["volumes"])


def test_dummy_and_pvc_sources() -> None:
    dummy = LLMEndpointSpec.model_validate(
        {"model": {"name": "m", "source": {"dummy": {"preset": "qwen2-0.5b"}}}}
    )
    assert engine_args(dummy)[2] == "dummy:qwen2-0.5b"
    pvc = LLMEndpointSpec.model_validate(
        {"model": {"name": "m", "source": {"pvc": {"claimName": "w", "subPath": "llama"}}}}
    )
    dep = engine.engine_deployment(OWNER, pvc, 1)
    assert engine_args(pvc)[2] == "/models/llama"
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "w", "readOnly": True},
    } in volumes


def test_desired_replicas_pinned_or_minimum() -> None:
    assert engine.desired_replicas(spec(scaling={"minReplicas": 2})) == 2
    assert engine.desired_replicas(spec(replicas=3)) == 3
    assert engine.selector_string("chat") == "kvscale.io/endpoint=chat,kvscale.io/role=engine"
