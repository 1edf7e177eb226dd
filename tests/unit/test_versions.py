"""One version: pyproject.toml, the package, the default engine image, the operator image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

import kvscale
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
    assert EngineSpec().container_image == f"kvscale/engine:{pyproject_version()}"
    assert EngineSpec(kind="vllm").container_image == "vllm/vllm-openai:v0.32.0"


def test_manifests_run_the_operator_image_of_this_version() -> None:
    base = yaml.safe_load((ROOT / "manifests" / "base" / "kustomization.yaml").read_text())
    assert base["images"] == [{"name": "kvscale/operator", "newTag": pyproject_version()}]


def test_make_image_tags_from_pyproject() -> None:
    """build-image.sh reads the version from pyproject.toml and hard-codes none."""
    script = (ROOT / "engine-image" / "build-image.sh").read_text()
    assert "pyproject.toml" in script and "OPERATOR_IMAGE=kvscale/operator:$VERSION" in script
    assert not re.search(r"kvscale/(engine|operator):[0-9]", script)
