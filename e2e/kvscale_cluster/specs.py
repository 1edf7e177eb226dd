"""LLMEndpoint bodies for tests and benchmarks, built in one place.

A spec is a dummy-weights model plus the sections a caller names; a named section replaces the
default one whole (pass `model=` for another model), so each test states what it depends on.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvscale.api.v1alpha1 import LLMEndpointSpec

JSON = dict[str, Any]
API_VERSION = "kvscale.io/v1alpha1"
MODEL: JSON = {"name": "tiny", "source": {"dummy": {}}}
HOST_PATH_MODEL: JSON = {"name": "llama-8b", "source": {"hostPath": {"path": "/models/llama"}}}


def spec_body(**sections: Any) -> JSON:
    """The spec as the API server stores it (camelCase keys)."""
    return copy.deepcopy({"model": MODEL, **sections})


def llm_spec(**sections: Any) -> LLMEndpointSpec:
    """The spec as the operator parses it."""
    from kvscale.api.v1alpha1 import LLMEndpointSpec

    return LLMEndpointSpec.model_validate(spec_body(**sections))


def endpoint_body(name: str, namespace: str | None = None, **sections: Any) -> JSON:
    """A whole LLMEndpoint object (no namespace: the caller's request names it)."""
    meta = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {
        "apiVersion": API_VERSION,
        "kind": "LLMEndpoint",
        "metadata": meta,
        "spec": spec_body(**sections),
    }
