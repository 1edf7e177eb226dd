"""The pydantic mirrors of the CRD's CEL rules refuse and accept the same values.

The same values go to the real API server in tests/controlplane/test_crd_admission.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from kvscale.api import rules
from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.children import engine
from kvscale.children.engine_args import engine_args
from kvscale.children.router import render_router
from kvscale_cluster.specs import MODEL, llm_spec

spec = llm_spec


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "host-path-dot-dot",
        {"model": {**MODEL, "source": {"hostPath": {"path": "/m/../etc"}}}},
        "..",
    ),
    (
        "host-path-ends-dot-dot",
        {"model": {**MODEL, "source": {"hostPath": {"path": "/m/.."}}}},
        "..",
    ),
    (
        "sub-path-dot-dot",
        {"model": {**MODEL, "source": {"pvc": {"claimName": "m", "subPath": "../x"}}}},
        "..",
    ),
    ("image-scheme", {"engine": {"image": "https://ghcr.io/x/engine:1"}}, "image reference"),
    ("image-uppercase", {"engine": {"image": "Kvscale/Engine:1"}}, "image reference"),
    ("image-space", {"engine": {"image": "kvscale/engine 1"}}, "image reference"),
    ("image-bad-digest", {"engine": {"image": "kvscale/engine@sha256:xyz"}}, "image reference"),
    ("managed-flag", {"engine": {"extraArgs": ["--port", "9000"]}}, "flag the operator manages"),
    ("managed-flag-equals", {"engine": {"extraArgs": ["--model=x"]}}, "operator manages"),
    ("managed-flag-underscore", {"engine": {"extraArgs": ["--max_model_len=8"]}}, "manages"),
    ("managed-short-flag", {"engine": {"extraArgs": ["-tp", "2"]}}, "operator manages"),
    ("not-an-argument", {"engine": {"extraArgs": ["---x"]}}, "must be a flag"),
    ("empty-argument", {"engine": {"extraArgs": [""]}}, "must be a flag"),
    ("multi-line-argument", {"engine": {"extraArgs": ["a\nb"]}}, "must be a flag"),
    ("negative-cpu", {"resources": {"cpu": -1}}, "greater than zero"),
    ("negative-cpu-string", {"resources": {"cpu": "-500m"}}, "greater than zero"),
    ("zero-memory", {"resources": {"memory": "0Gi"}}, "greater than zero"),
    ("bad-quantity", {"resources": {"cpu": "two"}}, "Kubernetes quantity"),
    ("gpu-type-without-gpus", {"resources": {"gpusPerReplica": 0, "gpuType": "A100"}}, "gpuType"),
    (
        "deferrable-wait-under-deadline",
        {"trafficClasses": [{"name": "b", "deadlineSeconds": 3600, "maxQueueWaitSeconds": 60}]},
        "at least its deadlineSeconds",
    ),
    (
        "interactive-wait-of-hours",
        {"trafficClasses": [{"name": "chat", "maxQueueWaitSeconds": 7200}]},
        "needs a deferrable class",
    ),
    ("deadline-over-a-day", {"trafficClasses": [{"name": "b", "deadlineSeconds": 90000}]}, "86400"),
    ("zero-deadline", {"trafficClasses": [{"name": "b", "deadlineSeconds": 0}]}, "greater than 0"),
    (
        "five-deferrable-classes",
        {"trafficClasses": [{"name": f"b{i}", "deadlineSeconds": 600} for i in range(5)]},
        "at most 4 trafficClasses may set deadlineSeconds",
    ),
    *(
        (f"prometheus-{name}", {"scaling": {"signals": {"prometheusUrl": url}}}, needle)
        for name, url, needle in [
            ("no-scheme", "prom:9090", "http:// or https://"),
            ("ftp", "ftp://prom:9090", "http:// or https://"),
            ("no-host", "http:///api", "http:// or https://"),
            ("metadata", "http://169.254.169.254/latest", "link-local"),
            ("ipv6-link-local", "http://[fe80::1]:9090", "link-local"),
            ("mapped-link-local", "http://[::ffff:169.254.169.254]/", "link-local"),
            ("integer-host", "http://2852039166/", "link-local"),
            ("octal-host", "http://0251.0376.0251.0376/", "link-local"),
        ]
    ),
]


@pytest.mark.parametrize(("case", "body", "needle"), REFUSED, ids=[c for c, _, _ in REFUSED])
def test_models_refuse_what_admission_refuses(case: str, body: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle.replace(".", r"\.").replace("+", r"\+")):
        LLMEndpointSpec.model_validate({"model": MODEL, **body})


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("cpu-as-number", {"resources": {"cpu": 4, "memory": "512Mi"}}),
    ("fractional-cpu", {"resources": {"cpu": "0.5", "memory": "1e9"}}),
    ("pvc-with-dots", {"model": {**MODEL, "source": {"pvc": {"claimName": "models.v2"}}}}),
    ("dots-inside-names", {"model": {**MODEL, "source": {"hostPath": {"path": "/m/..x/a..b"}}}}),
    ("registry-with-port", {"engine": {"image": "registry.example.com:5000/team/engine:0.1.0"}}),
    ("localhost-registry", {"engine": {"image": "localhost/engine"}}),
    ("digest", {"engine": {"image": "kvscale/engine:0.1@sha256:" + "a" * 64}}),
    ("unmanaged-flags", {"engine": {"extraArgs": ["--enforce-eager", "--seed=3", "-x", "-1"]}}),
    ("json-value", {"engine": {"extraArgs": ["--hf-overrides", '{"a": 1}']}}),
    ("gpu-type-with-gpus", {"resources": {"gpusPerReplica": 2, "gpuType": "NVIDIA-H100"}}),
    ("prometheus-service", {"scaling": {"signals": {"prometheusUrl": "http://prom.mon:9090"}}}),
    ("deferrable-class", {"trafficClasses": [{"name": "b", "deadlineSeconds": 14400}]}),
    (
        "deferrable-wait-above-deadline",
        {"trafficClasses": [{"name": "b", "deadlineSeconds": 600, "maxQueueWaitSeconds": 900}]},
    ),
    ("prometheus-ip", {"scaling": {"signals": {"prometheusUrl": "https://10.0.0.1/prom"}}}),
]


@pytest.mark.parametrize(("case", "body"), ACCEPTED, ids=[c for c, _ in ACCEPTED])
def test_models_accept_what_admission_accepts(case: str, body: dict[str, Any]) -> None:
    LLMEndpointSpec.model_validate({"model": MODEL, **body})


def test_cpu_written_as_a_number_reaches_the_pod_as_a_string() -> None:
    owner = engine.Owner("e", "ns", "uid")
    deployment = engine.engine_deployment(owner, spec(resources={"cpu": 4}), 1)
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "4"


def test_every_flag_the_operator_renders_is_managed() -> None:
    """extraArgs may not override any flag the operator writes, for either engine kind."""
    classes = [{"name": "chat"}]
    for kind in ("kvscale", "vllm"):
        for gpus in (0, 2):
            rendered = engine_args(
                spec(
                    engine={"kind": kind},
                    resources={"gpusPerReplica": gpus},
                    trafficClasses=classes,
                )
            )
            flags = {a.split("=", 1)[0] for a in rendered if a.startswith("-")}
            assert flags <= set(rules.MANAGED_FLAGS), flags - set(rules.MANAGED_FLAGS)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("tiny", None),
        ("a" * rules.MAX_ENDPOINT_NAME, None),
        ("a" * (rules.MAX_ENDPOINT_NAME + 1), rules.NAME_TOO_LONG),
        ("llama.v2", rules.NAME_NOT_LABEL),
        ("Llama", rules.NAME_NOT_LABEL),
    ],
)
def test_endpoint_names(name: str, problem: str | None) -> None:
    assert rules.endpoint_name_problem(name) == problem
    if problem is None:
        for suffix in rules.SERVICE_SUFFIXES:
            assert len(name + suffix) <= 63


def test_the_name_limit_follows_the_services() -> None:
    """The longest name allowed makes the longest Service name exactly 63 characters; every other
    child's name stays a DNS subdomain and every label value within 63."""
    owner = engine.Owner("a" * rules.MAX_ENDPOINT_NAME, "ns", "uid")
    spec = LLMEndpointSpec.model_validate({"model": {"name": "m", "source": {"dummy": {}}}})
    children = [*engine.render(owner, spec, 1), *render_router(owner, spec)]
    services = [c["metadata"]["name"] for c in children if c["kind"] == "Service"]
    assert max(len(s) for s in services) == 63
    assert {s.removeprefix(owner.name) for s in services} == set(rules.SERVICE_SUFFIXES)
    for child in children:
        assert re.fullmatch(rules.DNS_SUBDOMAIN, child["metadata"]["name"])
        assert all(len(v) <= 63 for v in child["metadata"]["labels"].values())


def test_derived_child_names_use_a_known_suffix() -> None:
    assert engine.engine_name("x").removeprefix("x") in rules.CHILD_SUFFIXES


def test_a_deferrable_class_waits_until_its_deadline_and_an_interactive_one_30_s() -> None:
    classes = [{"name": "chat"}, {"name": "batch", "priority": 0, "deadlineSeconds": 3600}]
    chat, batch = spec(trafficClasses=classes).traffic_classes
    assert (chat.deferrable, chat.queue_wait_seconds) == (False, 30.0)
    assert (batch.deferrable, batch.queue_wait_seconds) == (True, 3600)
    assert chat.rendered() == {"name": "chat", "priority": 0, "maxQueueWaitSeconds": 30.0}
    assert batch.rendered() == {
        "name": "batch",
        "priority": 0,
        "maxQueueWaitSeconds": 3600,
        "deadlineSeconds": 3600,
    }
