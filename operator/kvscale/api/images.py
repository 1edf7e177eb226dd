"""The images kvscale runs, and where the operator takes its defaults from.

An endpoint that pins no `spec.engine.image` follows the operator's default for its engine kind,
so upgrading the operator (or changing its default) rolls such endpoints through their
Deployments' rolling updates; a pinned image stays. Every endpoint's routers run the operator's
default router image (kvscale's router alone, without torch), whatever the engine's image or
kind, so a new default router image rolls the routers of pinned endpoints too.

The defaults come from the operator's configuration: the flags `--default-engine-image`,
`--default-vllm-image` and `--default-router-image` of `kvscale operator`, else the environment
variables below (what manifests/base/operator.yaml sets, and kustomize's `images:` rewrites), else
the images of this version.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kvscale import __version__
from kvscale.api.rules import image_reference

REGISTRY = "kvscale"  # `make image REGISTRY=...` builds <registry>/{engine,router,operator}
ENGINE_IMAGE = f"{REGISTRY}/engine:{__version__}"  # `make image` builds this tag
ROUTER_IMAGE = f"{REGISTRY}/router:{__version__}"
OPERATOR_IMAGE = f"{REGISTRY}/operator:{__version__}"
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"  # the release e2e/vllm/VERSION pins for the local cluster
ENGINE_ENV = "KVSCALE_DEFAULT_ENGINE_IMAGE"
VLLM_ENV = "KVSCALE_DEFAULT_VLLM_IMAGE"
ROUTER_ENV = "KVSCALE_DEFAULT_ROUTER_IMAGE"


@dataclass(frozen=True)
class DefaultImages:
    """The images an endpoint that pins none runs, per engine kind, and every endpoint's routers."""

    engine: str = ENGINE_IMAGE
    vllm: str = VLLM_IMAGE
    router: str = ROUTER_IMAGE

    def __post_init__(self) -> None:
        for image in (self.engine, self.vllm, self.router):
            try:
                image_reference(image)
            except ValueError as err:
                raise ValueError(f"Default image {image!r} {err}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> DefaultImages:
        """The defaults the environment sets (an empty variable counts as unset)."""
        return cls(
            env.get(ENGINE_ENV) or ENGINE_IMAGE,
            env.get(VLLM_ENV) or VLLM_IMAGE,
            env.get(ROUTER_ENV) or ROUTER_IMAGE,
        )

    def for_kind(self, kind: str) -> str:
        return self.vllm if kind == "vllm" else self.engine


DEFAULTS = DefaultImages()  # this version's
