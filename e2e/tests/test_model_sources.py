"""The huggingface model source on the local cluster, against a small Hub the test runs there
(`kvscale/hfhub`, kvscale_cluster.hf_hub) serving checkpoints the test made: no internet needed.

- an endpoint downloads its repository through its init container (huggingface_hub's
  snapshot_download, HF_ENDPOINT pointing at the Hub's Service, the token from a Secret) and
  serves it;
- a new revision rolls the replica onto the new snapshot;
- a missing repository, a wrong token and no token each read as a clear `Degraded` reason.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from test_autoscale import API, apply, condition, serving, status

from kvscale.children.engine_args import MODEL_MOUNT
from kvscale.kube import Kube
from kvscale_cluster.fixtures import Cluster, kubectl, wait_for
from kvscale_cluster.images import VENV_BIN

TOKEN = "hf_local_test_token"
HUB_PORT = 8000
ORG = "kvscale-e2e"  # what the tests download, and all they remove of the host's /models
# The process kubelet mounts no volume: every pod's /models (an emptyDir per pod on a real node)
# is the host's, so a download one test made is another's cache, and huggingface_hub serves a
# cached snapshot when the Hub refuses it. Each test starts and ends without this org's files.
HOST_MODELS = Path(MODEL_MOUNT)


def clear_downloads() -> None:
    for found in (
        *HOST_MODELS.glob(f"hub/models--{ORG}--*"),
        *HOST_MODELS.glob(f"hub/.locks/models--{ORG}--*"),
        *HOST_MODELS.glob(f"kvscale/{ORG}--*"),
    ):
        if found.is_symlink() or found.is_file():
            found.unlink()
        else:
            shutil.rmtree(found)


@pytest.fixture(scope="module", autouse=True)
def host_models() -> Iterator[None]:
    """The host's /models goes again after the module when the tests made it."""
    made = not HOST_MODELS.exists()
    yield
    if made:
        shutil.rmtree(HOST_MODELS, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_downloads(host_models: None) -> Iterator[None]:
    clear_downloads()
    yield
    clear_downloads()


@pytest.fixture
def hub(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[str]:
    """The Hub's URL: kvscale-e2e/tiny with branches v1 and v2 (other seeds), behind a token."""
    for branch, seed in (("v1", 0), ("v2", 1)):
        path = tmp_path / "hub" / ORG / "tiny" / branch
        subprocess.run(
            [str(VENV_BIN / "kvscale-engine"), "tiny-checkpoint", str(path), "--seed", str(seed)],
            check=True,
            capture_output=True,
        )
    labels = {"app": "hub"}
    container = {
        "name": "hub",
        "image": "kvscale/hfhub:latest",
        "args": ["--root", str(tmp_path / "hub"), "--port", str(HUB_PORT), "--token", TOKEN],
        "ports": [{"name": "http", "containerPort": HUB_PORT}],
        "readinessProbe": {"tcpSocket": {"port": HUB_PORT}, "periodSeconds": 1},
    }
    objects = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "hub"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "hub"},
            "spec": {"selector": labels, "ports": [{"port": HUB_PORT, "targetPort": "http"}]},
        },
        *(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name},
                "stringData": {"HF_TOKEN": token},
            }
            for name, token in (("hf", TOKEN), ("hf-wrong", "hf_not_the_token"))
        ),
    ]
    for obj in objects:
        apply(cluster, namespace, obj)
    kubectl(cluster, "-n", namespace, "rollout", "status", "deployment/hub", "--timeout=120s")
    yield f"http://hub.{namespace}.svc.cluster.local:{HUB_PORT}"


def endpoint(name: str, hub: str, **source: Any) -> dict[str, Any]:
    huggingface = {"repo": f"{ORG}/tiny", "revision": "v1", "endpoint": hub, **source}
    spec = {
        "model": {"name": "tiny", "source": {"huggingface": huggingface}, "maxModelLen": 256},
        "engine": {"maxNumSeqs": 4, "maxNumBatchedTokens": 256},
        "resources": {"gpusPerReplica": 0, "cpu": "500m", "memory": "1Gi"},
        "scaling": {"minReplicas": 1, "maxReplicas": 1},
    }
    return {"apiVersion": API, "kind": "LLMEndpoint", "metadata": {"name": name}, "spec": spec}


def complete(url: str) -> str:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    answer = client.completions.create(model="tiny", prompt="Hello", max_tokens=4)
    return answer.choices[0].text


def engine_pods(api: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    return api.list_pods(namespace, f"kvscale.io/endpoint={name},kvscale.io/role=engine")


def served_from(pod: dict[str, Any]) -> str:
    args = pod["spec"]["containers"][0]["args"]
    return str(args[args.index("--model") + 1])


def test_a_huggingface_source_is_downloaded_served_and_rolled_to_a_new_revision(
    cluster: Cluster, operator: Any, api: Kube, namespace: str, hub: str
) -> None:
    apply(cluster, namespace, endpoint("chat", hub, tokenSecret={"name": "hf"}))
    url = serving(api, namespace, ready=1)
    assert complete(url)
    (first,) = engine_pods(api, namespace, "chat")
    assert served_from(first) == f"/models/kvscale/{ORG}--tiny@v1"
    init = first["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0

    apply(cluster, namespace, endpoint("chat", hub, revision="v2", tokenSecret={"name": "hf"}))

    def rolled() -> dict[str, Any] | None:
        pods = engine_pods(api, namespace, "chat")
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        ready = [
            p
            for p in live
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        if len(pods) == 1 and len(ready) == 1 and served_from(ready[0]).endswith("@v2"):
            return ready[0]
        return None

    second = wait_for(rolled, timeout=300, what="chat rolled onto revision v2")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert complete(url)
    assert condition(status(api, namespace), "Degraded")["status"] == "False"


@pytest.mark.parametrize(
    ("name", "source", "reason"),
    [
        (
            "missing",
            {"repo": f"{ORG}/no-such-model", "tokenSecret": {"name": "hf"}},
            "ModelNotFound",
        ),
        ("denied", {"tokenSecret": {"name": "hf-wrong"}}, "ModelAccessDenied"),
        ("no-token", {}, "ModelNotFound"),  # the Hub hides a private repo from anonymous clients
    ],
)
def test_a_failed_download_reads_as_a_clear_degraded_reason(
    cluster: Cluster,
    operator: Any,
    api: Kube,
    namespace: str,
    hub: str,
    name: str,
    source: dict[str, Any],
    reason: str,
) -> None:
    apply(cluster, namespace, endpoint(name, hub, **source))

    def degraded() -> dict[str, Any] | None:
        cond = condition(status(api, namespace, name), "Degraded")
        return cond if cond.get("reason") == reason else None

    cond = wait_for(degraded, timeout=180, what=f"{name} Degraded with {reason}")
    assert cond["status"] == "True" and "init container fetch-model exited" in cond["message"]
    assert condition(status(api, namespace, name), "Available")["status"] == "False"
