"""The API models: defaults, validation mirrors of the CEL rules, and the generated CRD."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kvscale.api.crd import crd, crd_yaml
from kvscale.api.v1alpha1 import LLMEndpointSpec

ROOT = Path(__file__).resolve().parents[3]
MINIMAL = {"model": {"name": "tiny", "source": {"dummy": {}}}}


def test_minimal_spec_gets_defaults() -> None:
    spec = LLMEndpointSpec.model_validate(MINIMAL)
    assert spec.engine.kind == "kvscale"
    assert spec.engine.block_size == 16
    assert spec.scaling.min_replicas == 1
    assert spec.replicas is None and not spec.pinned


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"scaling": {"minReplicas": 3, "maxReplicas": 2}}, "minReplicas must not exceed"),
        ({"replicas": 9, "scaling": {"maxReplicas": 2}}, "spec.replicas must not exceed"),
        ({"trafficClasses": [{"name": "a"}, {"name": "a"}]}, "names must be unique"),
        ({"engine": {"kind": "tgi"}}, "kind"),
        ({"bogus": 1}, "Extra inputs"),
    ],
)
def test_invalid_specs_are_refused(patch: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        LLMEndpointSpec.model_validate({**MINIMAL, **patch})


def test_model_source_needs_exactly_one() -> None:
    body = {"model": {"name": "m", "source": {"dummy": {}, "hostPath": {"path": "/m"}}}}
    with pytest.raises(ValidationError, match="exactly one of"):
        LLMEndpointSpec.model_validate(body)


def test_committed_crd_matches_the_models() -> None:
    committed = (ROOT / "crds" / "llmendpoints.kvscale.io.yaml").read_text()
    assert committed == crd_yaml(), "crds/ is stale: run `make crds`"


def _walk(node: object) -> list[dict[str, object]]:
    found: list[dict[str, object]] = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found += _walk(value)
    elif isinstance(node, list):
        for value in node:
            found += _walk(value)
    return found


def test_crd_schema_is_structural() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node
        assert node.get("additionalProperties") is not False
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node


def test_crd_has_subresources_and_columns() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    # a path the server always fills: GET /scale fails where the field is absent
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.scaling.minReplicas"
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names == [
        "Model",
        "URL",
        "Desired",
        "Ready",
        "Available",
        "SLO",
        "Image",
        "Reason",
        "Age",
    ]
    conds = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map"
    assert conds["x-kubernetes-list-map-keys"] == ["type"]
    assert yaml.safe_load(crd_yaml()) == crd()


def _schema_nodes(node: dict[str, object], path: str) -> list[tuple[str, dict[str, object]]]:
    """Every node of a schema with its path (`.spec.scaling.minReplicas`, `.spec.x[]`)."""
    found = [(path, node)]
    for name, sub in node.get("properties", {}).items():  # type: ignore[attr-defined]
        found += _schema_nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _schema_nodes(node["items"], f"{path}[]")  # type: ignore[arg-type]
    return found


def test_every_schema_node_has_a_description() -> None:
    """`kubectl explain llme.spec...` answers for every field."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    nodes = _schema_nodes(schema, "")
    # metadata's description is the API server's own (a CRD may not set one)
    bare = [p or "." for p, node in nodes if not node.get("description") and p != ".metadata"]
    assert not bare, f"{len(bare)} schema nodes have no description: {bare}"


def test_descriptions_state_scalar_defaults() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    scaling = schema["properties"]["spec"]["properties"]["scaling"]["properties"]
    assert scaling["capacityIntervalSeconds"]["description"].endswith("Default: 60.")
    assert "seconds" in scaling["capacityIntervalSeconds"]["description"].lower()
    engine = schema["properties"]["spec"]["properties"]["engine"]["properties"]
    assert engine["enablePrefixCaching"]["description"].endswith("Default: true.")


def test_traffic_classes_are_a_list_map_keyed_by_name() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    classes = spec["properties"]["trafficClasses"]
    assert classes["x-kubernetes-list-type"] == "map"
    assert classes["x-kubernetes-list-map-keys"] == ["name"]
    assert "name" in classes["items"]["required"]  # a list-map key may not be absent


def test_status_defaults_to_unobserved() -> None:
    """The server fills this in on read, so kstatus sees generation 1 against observed 0."""
    status = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["default"] == {"observedGeneration": 0}
