"""One version: pyproject.toml, the package, the default images, the manifests' and the build's
image names, and the OCI labels `make image` puts on them."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import yaml

import kvscale
from kvscale.api.images import DefaultImages
from kvscale.api.v1alpha1 import EngineSpec

ROOT = Path(__file__).resolve().parents[2]


def pyproject_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def test_package_version_is_pyprojects() -> None:
    assert kvscale.__version__ == pyproject_version()


def test_default_engine_image_is_tagged_with_the_version() -> None:
    """The CRD defaults no image (it depends on the kind); the operator picks the kind's own."""
    crd = yaml.safe_load((ROOT / "crds" / "llmendpoints.kvscale.io.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    image = schema["properties"]["spec"]["properties"]["engine"]["properties"]["image"]
    assert "default" not in image
    defaults = DefaultImages()
    assert EngineSpec().container_image(defaults) == f"kvscale/engine:{pyproject_version()}"
    assert EngineSpec(kind="vllm").container_image(defaults) == "vllm/vllm-openai:v0.32.0"


def test_manifests_set_every_image_of_this_version_in_one_place() -> None:
    """kustomization.yaml's `images:` names the operator's image and its default engine, router
    and vLLM images (env values its image transformer rewrites, kustomizeconfig.yaml)."""
    base = yaml.safe_load((ROOT / "manifests" / "base" / "kustomization.yaml").read_text())
    defaults = DefaultImages()
    assert base["images"] == [
        {"name": "kvscale/operator", "newTag": pyproject_version()},
        {"name": "kvscale/engine", "newTag": pyproject_version()},
        {"name": "kvscale/router", "newTag": pyproject_version()},
        {"name": "vllm/vllm-openai", "newTag": defaults.vllm.split(":")[1]},
    ]
    config = yaml.safe_load((ROOT / "manifests" / "base" / "kustomizeconfig.yaml").read_text())
    assert {"kind": "Deployment", "path": "spec/template/spec/containers/env/value"} in config[
        "images"
    ]
    operator = yaml.safe_load((ROOT / "manifests" / "base" / "operator.yaml").read_text())
    env = operator["spec"]["template"]["spec"]["containers"][0]["env"]
    untagged = {e["name"]: e["value"] for e in env}
    assert DefaultImages.from_env(untagged).engine == "kvscale/engine"  # tagged by `images:`
    assert DefaultImages.from_env(untagged).vllm == "vllm/vllm-openai"
    assert DefaultImages.from_env(untagged).router == "kvscale/router"


def test_make_image_tags_from_pyproject() -> None:
    """build-image.sh reads the version from pyproject.toml and hard-codes none."""
    script = (ROOT / "engine-image" / "build-image.sh").read_text()
    assert "pyproject.toml" in script and "TAG=${TAG:-$VERSION}" in script
    assert not re.search(r"kvscale/(engine|router|operator):[0-9]", script)


def dry_run(**env: str) -> list[list[str]]:
    """The docker build commands `build-image.sh --dry-run` prints."""
    done = subprocess.run(
        [str(ROOT / "engine-image" / "build-image.sh"), "--dry-run"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return [shlex.split(line) for line in done.stdout.splitlines() if line.strip()]


def labels_and_tag(cmd: list[str]) -> tuple[dict[str, str], str]:
    labels = dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--label")
    return labels, cmd[cmd.index("-t") + 1]


def test_make_image_builds_every_image_with_oci_labels() -> None:
    revision = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    cmds = dry_run(SOURCE="https://example.com/kvscale", REGISTRY="reg.example.com/t", TAG="7")
    built = dict(reversed(labels_and_tag(c)) for c in cmds)
    assert set(built) == {
        "reg.example.com/t/engine:7",
        "reg.example.com/t/router:7",
        "reg.example.com/t/operator:7",
    }
    for labels in built.values():
        assert labels["org.opencontainers.image.source"] == "https://example.com/kvscale"
        assert labels["org.opencontainers.image.version"] == pyproject_version()
        assert labels["org.opencontainers.image.revision"] == revision


def test_make_image_defaults_to_the_operators_default_images() -> None:
    """Unset, REGISTRY and TAG name what the operator runs by default (the CUDA engine: -cuda;
    the router has no variant)."""
    defaults = DefaultImages()
    tags = {labels_and_tag(c)[1] for c in dry_run(REGISTRY="", TAG="", VARIANT="cpu")}
    assert tags == {defaults.engine, defaults.router, f"kvscale/operator:{pyproject_version()}"}
    cuda = {labels_and_tag(c)[1] for c in dry_run(REGISTRY="", TAG="", VARIANT="cuda")}
    assert {f"{defaults.engine}-cuda", defaults.router} <= cuda


def test_make_image_builds_only_the_images_named() -> None:
    """IMAGES picks images: the router alone, say, for a node that runs no engine."""
    tags = [labels_and_tag(c)[1] for c in dry_run(REGISTRY="", TAG="", IMAGES="router")]
    assert tags == [DefaultImages().router]
