"""The huggingface model source: an init container fills the model volume in the Hub's cache
layout, the engine serves the revision's snapshot, and a failed download reads as Degraded."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kvscale.api.images import DefaultImages
from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.children import engine
from kvscale.status.endpoint import FETCH_FAILURES, Observed
from kvscale_cluster.specs import llm_spec
from kvscale_engine import fetch

JSON = dict[str, Any]
OWNER = engine.Owner("chat", "team-a", "uid-1")
HF = {"repo": "org/tiny", "revision": "v1", "endpoint": "http://hub.models:8000"}


def spec(**source: Any) -> LLMEndpointSpec:
    return llm_spec(model={"name": "tiny", "source": {"huggingface": {**HF, **source}}})


def pod(s: LLMEndpointSpec) -> JSON:
    spec_: JSON = engine.engine_deployment(OWNER, s, 1)["spec"]["template"]["spec"]
    return spec_


def test_an_init_container_downloads_into_the_model_volume() -> None:
    p = pod(spec(tokenSecret={"name": "hf"}))
    (init,) = p["initContainers"]
    assert init["name"] == "fetch-model" and init["command"] == ["kvscale-engine"]
    link = "/models/kvscale/org--tiny@v1"
    assert init["args"] == [
        "fetch", "--repo", "org/tiny", "--revision", "v1",
        "--cache-dir", "/models/hub", "--link", link,
    ]  # fmt: skip
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_ENDPOINT"]["value"] == "http://hub.models:8000"
    assert env["HF_HUB_OFFLINE"]["value"] == "0"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "HF_TOKEN"}
    assert {"name": "model", "mountPath": "/models"} in init["volumeMounts"]
    assert {"name": "model", "emptyDir": {}} in p["volumes"]
    c = p["containers"][0]
    assert c["args"][c["args"].index("--model") + 1] == link
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert init["image"] == c["image"] == DefaultImages().engine


def test_a_claim_is_filled_once_and_reused() -> None:
    p = pod(spec(claimName="hub-cache"))
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "hub-cache"}} in p["volumes"]


def test_a_new_revision_rolls_the_replicas() -> None:
    one, two = pod(spec()), pod(spec(revision="v2"))
    assert one != two
    assert "/models/kvscale/org--tiny@v2" in two["containers"][0]["args"]


def test_vllm_downloads_with_kvscales_image_and_serves_the_snapshot() -> None:
    s = llm_spec(model={"name": "tiny", "source": {"huggingface": HF}}, engine={"kind": "vllm"})
    p = pod(s)
    assert p["initContainers"][0]["image"] == DefaultImages().engine
    args = p["containers"][0]["args"]
    assert args[args.index("--model") + 1] == "/models/kvscale/org--tiny@v1"


def test_template_env_reaches_the_download() -> None:
    s = llm_spec(
        model={"name": "tiny", "source": {"huggingface": {"repo": "org/tiny"}}},
        podTemplate={"envFrom": [{"secretRef": {"name": "hub"}}]},
    )
    assert pod(s)["initContainers"][0]["envFrom"] == [{"secretRef": {"name": "hub"}}]


@pytest.mark.parametrize(
    "source",
    [
        {"repo": "org/tiny/extra"},
        {"repo": "-bad"},
        {"repo": "org/tiny", "revision": "../x"},
        {"repo": "org/tiny", "endpoint": "ftp://hub"},
        {"repo": "org/tiny", "claimName": "Bad_Name"},
    ],
)
def test_bad_sources_are_refused(source: JSON) -> None:
    with pytest.raises(ValidationError):
        llm_spec(model={"name": "tiny", "source": {"huggingface": source}})


def init_pod(state: JSON, last: JSON | None = None) -> JSON:
    status = {"name": "fetch-model", "state": state, "lastState": last or {}}
    return {"metadata": {"name": "chat-engine-1"}, "status": {"initContainerStatuses": [status]}}


def failed(code: int) -> JSON:
    return {"terminated": {"exitCode": code, "reason": "Error"}}


def test_a_failed_download_reads_as_a_clear_degraded_reason() -> None:
    backing_off = {"waiting": {"reason": "CrashLoopBackOff"}}
    missing = Observed.read({"metadata": {}, "status": {}}, [init_pod(backing_off, failed(3))])
    assert [p.reason for p in missing.failing] == ["ModelNotFound"]
    assert "no such repository or revision" in missing.failing[0].message
    denied = Observed.read({"metadata": {}, "status": {}}, [init_pod(failed(4))])
    assert [p.reason for p in denied.failing] == ["ModelAccessDenied"]
    other = Observed.read({"metadata": {}, "status": {}}, [init_pod(failed(1))])
    assert [p.reason for p in other.failing] == ["ModelFetchFailed"]
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    recovered = Observed.read({"metadata": {}, "status": {}}, [init_pod(done, failed(3))])
    assert recovered.failing == []
    no_secret = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf"'}}
    config = Observed.read({"metadata": {}, "status": {}}, [init_pod(no_secret)])
    assert [p.reason for p in config.failing] == ["EngineConfigError"]


def test_fetch_exit_codes_are_the_operators() -> None:
    """The operator reads `kvscale-engine fetch`'s exit codes (they meet only through the pod)."""
    assert FETCH_FAILURES[fetch.NOT_FOUND][0] == "ModelNotFound"
    assert FETCH_FAILURES[fetch.ACCESS_DENIED][0] == "ModelAccessDenied"
    assert fetch.FAILED not in FETCH_FAILURES
