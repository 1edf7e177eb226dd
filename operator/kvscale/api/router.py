"""spec.router: where an endpoint's router pods run, apart from its engine pods.

The routers run the operator's small CPU image, so a cluster puts them on a CPU node pool rather
than beside the engines on GPU nodes: a node selector and tolerations of their own, with the same
types, limits and key checks as spec.podTemplate's (whose placement stays the engine pods' only),
but no GPU label restriction.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from kvscale.api.base import Model, rules_of
from kvscale.api.pod_template import (
    MAX_NODE_LABELS,
    MAX_TOLERATIONS,
    QUALIFIED,
    NodeLabels,
    Toleration,
    keys_rule,
    qualified,
)

NODE_SELECTOR_KEY_MESSAGE = "router.nodeSelector keys must be " + QUALIFIED

DESCRIPTION = (
    "Placement of the router pods (the operator's CPU router image), apart from the engine "
    "pods': podTemplate's nodeSelector, tolerations and affinity reach only the engines."
)


class RouterSpec(Model):
    """Where the router pods run (see DESCRIPTION)."""

    model_config = ConfigDict(
        json_schema_extra=rules_of(keys_rule("nodeSelector", NODE_SELECTOR_KEY_MESSAGE))
    )
    node_selector: Annotated[
        NodeLabels | None,
        Field(
            max_length=MAX_NODE_LABELS,
            description="Node labels the router pods require (e.g. a CPU node pool's).",
        ),
    ] = None
    tolerations: Annotated[
        list[Toleration],
        Field(max_length=MAX_TOLERATIONS, description="Tolerations of the router pods."),
    ] = []

    @model_validator(mode="after")
    def _keys(self) -> RouterSpec:
        if not qualified(self.node_selector):
            raise ValueError(NODE_SELECTOR_KEY_MESSAGE)
        return self
