"""Container images the process kubelet can "run": each maps to a local command.

There is no registry and no container runtime; an image's repository selects an entry point in
this Python environment, and ``command``/``args`` work as they would on a real node. Images are
matched on their repository (tag and digest ignored, any registry prefix allowed), so the same
manifests name real images on a real cluster.

vLLM's image (`vllm/vllm-openai`) runs vLLM's OpenAI server from the venv that `make vllm`
(e2e/vllm/install.sh) builds once under ``$KVSCALE_CACHE`` (default ``~/.cache/kvscale``): the
version pinned in e2e/vllm/VERSION, whatever the image's tag. A missing venv refuses the pod
(ErrImagePull) with a message naming `make vllm`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

VENV_BIN = Path(sys.executable).parent
VLLM_VERSION_FILE = Path(__file__).resolve().parent.parent / "vllm" / "VERSION"
VLLM_REPOSITORY = "vllm/vllm-openai"
VLLM_SERVER = ("-m", "vllm.entrypoints.openai.api_server")  # its `vllm` script does not run here

# repository -> entry point (the image's ENTRYPOINT); a bare name is a console script in VENV_BIN
ENTRYPOINTS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "kvscale/engine": ("kvscale-engine",),
        "kvscale/router": ("kvscale-router",),
        "kvscale/operator": ("kvscale",),
        "kvscale/testserver": (sys.executable, "-m", "kvscale_cluster.testserver"),
        "kvscale/hfhub": (sys.executable, "-m", "kvscale_cluster.hf_hub"),  # a small HF Hub
    }
)


class ImageError(RuntimeError):
    """The image has no local command; the pod reports ErrImagePull with this message."""


def repository(image: str) -> str:
    """``ghcr.io/x/kvscale/engine:0.1@sha256:..`` -> ``ghcr.io/x/kvscale/engine``."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def vllm_venv() -> Path:
    """The cached vLLM venv (it may not exist yet)."""
    cache = Path(os.environ.get("KVSCALE_CACHE") or Path.home() / ".cache" / "kvscale")
    return cache / "vllm" / VLLM_VERSION_FILE.read_text().strip()


def vllm_python(image: str) -> str:
    """The cached vLLM venv's python, or an ImageError that says how to build it."""
    venv = vllm_venv()
    if not (venv / ".installed-stamp").exists():
        raise ImageError(
            f'Failed to pull image "{image}": vLLM is not installed for the process kubelet '
            f"({venv} has no finished install); run `make vllm` (e2e/vllm/install.sh) once"
        )
    return str(venv / "bin" / "python")


def entrypoint(image: str) -> list[str]:
    repo = repository(image)
    if repo == VLLM_REPOSITORY or repo.endswith("/" + VLLM_REPOSITORY):
        return [vllm_python(image), *VLLM_SERVER]
    for known, argv in ENTRYPOINTS.items():
        if repo == known or repo.endswith("/" + known):
            return list(argv)
    raise ImageError(
        f'Failed to pull image "{image}": the kvscale process kubelet has no command for '
        f"repository {repo!r} (known: {', '.join(sorted([*ENTRYPOINTS, VLLM_REPOSITORY]))})"
    )


def _executable(name: str, image: str) -> str:
    if os.path.isabs(name):
        return name
    local = VENV_BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise ImageError(f'Image "{image}": command {name!r} is not installed in {VENV_BIN}')
    return found


def container_argv(container: dict[str, Any]) -> list[str]:
    """The argv a container runs: its ``command`` (or the image's entry point) plus ``args``."""
    image = container.get("image", "")
    base = entrypoint(image)
    command = container.get("command") or base
    args = container.get("args") or []
    return [_executable(command[0], image), *command[1:], *args]
