"""What every API model shares: camelCase on the wire, unknown fields refused, and CEL rules
(`x-kubernetes-validations`) attached to a model's or a field's schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


def rules_of(*pairs: tuple[str, str]) -> dict[str, Any]:
    """CEL rules, each with its message, for a `json_schema_extra`."""
    return validations(*({"rule": r, "message": m} for r, m in pairs))


def validations(*checks: dict[str, Any]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(checks)}


class Model(BaseModel):
    """Base: camelCase on the wire, unknown fields refused, immutable once parsed."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, alias_generator=to_camel
    )
