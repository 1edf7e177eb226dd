"""Generates the LLMEndpoint CustomResourceDefinition from the pydantic models.

Pydantic writes JSON Schema 2020-12; the API server wants a structural OpenAPI v3 schema. The
translation inlines `$ref`s, turns `Optional[X]` into an optional `X` and `int | str` into
`x-kubernetes-int-or-string`, rewrites numeric `exclusiveMinimum` into the OpenAPI boolean form,
drops what structural schemas forbid (`additionalProperties: false`, titles), and keeps each
section's fully expanded default so the server fills it when the user leaves a whole section out
(CEL rules see complete objects). A field's scalar default is appended to its description, so
`kubectl explain` shows it. Rules on metadata.name sit on the schema's root.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from pydantic import BaseModel

from kvscale.api import status as status_api
from kvscale.api import v1alpha1 as api

JSON = dict[str, Any]


def structural(model: type[BaseModel]) -> JSON:
    """The structural schema of a model, as the API server accepts it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs: JSON = raw.pop("$defs", {})
    return _convert(raw, defs)


def _convert(node: JSON, defs: JSON) -> JSON:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if sorted(o.get("type", "") for o in options) == ["integer", "string"]:
            return _convert({"x-kubernetes-int-or-string": True, **rest}, defs)
        if len(options) != 1:
            raise ValueError(f"Unions are not expressible in a structural schema: {node}")
        if rest.get("default", ...) is None:
            del rest["default"]
        return _convert({**options[0], **rest}, defs)
    out: JSON = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        else:
            out[key] = value
    if isinstance(out.get("default"), dict):
        out["default"] = _prune(out["default"])
    if out.get("type") == "array" and out.get("default") == []:
        del out["default"]
    if "description" in out and isinstance(out.get("default"), bool | int | float | str):
        out["description"] = f"{out['description']} Default: {_literal(out['default'])}."
    return out


def _literal(value: bool | int | float | str) -> str:
    """A default as a user writes it (`true`, `60`, `8Gi`)."""
    return value if isinstance(value, str) and value else json.dumps(value)


def _prune(value: Any) -> Any:
    """A default as the server stores it: no nulls, no empty lists."""
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v is not None and v != []}
    return value


def _printer_columns() -> list[JSON]:
    return [
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
        {"name": "URL", "type": "string", "jsonPath": ".status.url"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {
            "name": "Available",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Available")].status',
        },
        {
            "name": "SLO",
            "type": "number",
            "description": "Share of recent minutes within the SLO",
            "jsonPath": ".status.slo.attainment",
        },
        {
            "name": "Image",
            "type": "string",
            "priority": 1,
            "jsonPath": ".status.images.engine",
        },
        {
            "name": "Reason",
            "type": "string",
            "priority": 1,
            "jsonPath": ".status.capacity.reason",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


UNOBSERVED: JSON = {"observedGeneration": 0}


def crd() -> JSON:
    """The full CustomResourceDefinition object."""
    spec_schema = structural(api.LLMEndpointSpec)
    status_schema = structural(status_api.LLMEndpointStatus)
    # An endpoint the operator has not yet observed reads as in progress to kstatus (Flux, Argo
    # CD): the server fills this default in whenever it reads an object without status (a create
    # drops the status it was sent), and observedGeneration 0 never equals a generation.
    status_schema["default"] = UNOBSERVED
    schema = {
        "type": "object",
        "description": "An autoscaled LLM inference endpoint.",
        "required": ["spec"],
        "x-kubernetes-validations": api.ENDPOINT_RULES,
        "properties": {
            "apiVersion": {"type": "string", "description": f"{api.GROUP}/{api.VERSION}"},
            "kind": {"type": "string", "description": api.KIND},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{api.PLURAL}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["all", "kvscale"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            # always present (defaulted), so GET /scale answers on an
                            # autoscaling endpoint; a PUT sets the floor the autoscaler keeps
                            "specReplicasPath": ".spec.scaling.minReplicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Writes a schema shared by several fields out in full each time (no YAML anchors)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml() -> str:
    header = "# Generated by `kvscale crd` from operator/kvscale/api; do not edit by hand.\n"
    return header + yaml.dump(crd(), Dumper=_NoAliases, sort_keys=False, width=100)
