"""Rendering of the endpoint's children: deterministic, owned, secure and complete."""

from typing import Any

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.children import engine
from kvscale.children.engine_args import engine_args
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


def test_vllm_kind_renders_vllm_flags_and_probes() -> None:
    s = spec(engine={"kind": "vllm", "image": "vllm/vllm-openai:v0.11.0"})
    c = container(engine.engine_deployment(OWNER, s, 1))
    assert "--gpu-memory-utilization" in c["args"] and "serve" not in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "lifecycle" not in c


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
