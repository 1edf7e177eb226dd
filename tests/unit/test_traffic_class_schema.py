"""--traffic-classes has one definition, engine-image/traffic-classes.schema.json.

The engine and the router may not import each other, so each parses the flag itself; these tests
hold both parsers, and the flag the operator renders, to the schema: the same keys and spellings,
the same defaults, the same documents accepted and refused, the same values read. A change to one
parser that the schema (and so the other parser) does not follow fails here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.children import engine, engine_args
from kvscale.children import router as router_children
from kvscale_engine.server import admission as engine_admission
from kvscale_router import admission as router_admission

SCHEMA_PATH = Path(__file__).parents[2] / "engine-image" / "traffic-classes.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
CLASS_SCHEMA: dict[str, Any] = SCHEMA["$defs"]["trafficClass"]
PROPERTIES: dict[str, Any] = CLASS_SCHEMA["properties"]
PARSERS = {
    "engine": (engine_admission.parse_traffic_classes, engine_admission.AdmissionConfigError),
    "router": (router_admission.parse_traffic_classes, router_admission.ClassConfigError),
}


# the schema, read as JSON Schema (the keywords the file uses)


def _is_type(value: Any, name: str) -> bool:
    """JSON types as `json.loads` reads them: an integer is written without a fraction."""
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    kinds: dict[str, type] = {"string": str, "null": type(None), "object": dict, "array": list}
    return isinstance(value, kinds[name])


def valid(value: Any, schema: dict[str, Any]) -> bool:
    if "$ref" in schema:
        return valid(value, SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]])
    if "anyOf" in schema:
        return any(valid(value, option) for option in schema["anyOf"])
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is_type(value, n) for n in names):
            return False
    if "minimum" in schema and _is_type(value, "number") and not value >= schema["minimum"]:
        return False
    bound = schema.get("exclusiveMinimum")
    if bound is not None and _is_type(value, "number") and not value > bound:
        return False
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        return False
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return False
        return all(valid(item, schema.get("items", {})) for item in value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and not set(value) <= set(props):
            return False
        return all(valid(v, props[k]) for k, v in value.items() if k in props)
    return True


def canonical(document: Any) -> Any:
    """Keys spelt as in the schema: snake_case, any case and the aliases are read alike."""
    spellings = {
        _normalised(spelling): key
        for key, prop in PROPERTIES.items()
        for spelling in (key, *prop["x-kvscale-aliases"])
    }
    if isinstance(document, list):
        return [canonical(item) for item in document]
    if isinstance(document, dict):
        return {spellings.get(_normalised(k), k): v for k, v in document.items()}
    return document


def expected_to_parse(document: Any) -> bool:
    """Valid against the schema, and the names unique (which JSON Schema cannot say).

    Two spellings of one key in an object are both read (the last one counts), so both must hold.
    """
    if not valid(canonical(document), SCHEMA):
        return False
    items = [document] if isinstance(document, dict) else document
    if not all(valid(canonical({k: v}), CLASS_SCHEMA) for i in items for k, v in i.items()):
        return False
    items = [canonical(i) for i in items]
    names = [i.get("name", PROPERTIES["name"]["default"]) for i in items]
    return len(set(names)) == len(names)


def parse(parser: str, document: Any) -> tuple[dict[str, Any], ...] | None:
    """What a parser reads from the flag, as plain fields; None when it refuses the flag."""
    parse_classes, config_error = PARSERS[parser]
    try:
        classes = parse_classes(json.dumps(document))
    except config_error:
        return None
    return tuple(_fields(c) for c in classes)


def _fields(traffic_class: Any) -> dict[str, Any]:
    wanted = {p["x-kvscale-field"] for p in PROPERTIES.values()}
    return {k: v for k, v in dataclasses.asdict(traffic_class).items() if k in wanted}


def _normalised(key: str) -> str:
    return key.replace("_", "").lower()


# the keys and their defaults


@pytest.mark.parametrize("parser", [engine_admission, router_admission], ids=["engine", "router"])
def test_each_parser_takes_exactly_the_schemas_keys_and_spellings(parser: Any) -> None:
    spellings = {
        _normalised(spelling): prop["x-kvscale-field"]
        for key, prop in PROPERTIES.items()
        for spelling in (key, *prop["x-kvscale-aliases"])
    }
    assert spellings == parser._KEYS


@pytest.mark.parametrize(
    "traffic_class", [engine_admission.TrafficClass, router_admission.TrafficClass]
)
def test_each_parsers_class_has_the_schemas_fields_and_defaults(traffic_class: Any) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(traffic_class)}
    assert defaults == {p["x-kvscale-field"]: p["default"] for p in PROPERTIES.values()}


def test_an_empty_object_reads_as_the_schemas_defaults() -> None:
    want = ({p["x-kvscale-field"]: p["default"] for p in PROPERTIES.values()},)
    assert parse("engine", {}) == parse("router", {}) == want


# documents: the schema, the engine and the router agree on every one

NAMES = st.sampled_from(["default", "interactive", "batch", "a.b-c_1", "", "no spaces", "x" * 64])
DURATIONS = st.sampled_from(["250ms", "2s", "1m", "1.5", " 3 s ", "-1s", "1e3", "two", "5h"])
VALUES = st.one_of(
    st.integers(min_value=-3, max_value=300),
    st.floats(min_value=-5, max_value=50, allow_nan=False),
    st.none(),
    st.booleans(),
    NAMES,
    DURATIONS,
    st.just([]),
    st.just({}),
)
CLASS = st.dictionaries(
    st.sampled_from([*PROPERTIES, "max_queue", "MAXCONCURRENCY", "maxQueueWait", "unknownField"]),
    st.one_of(VALUES, NAMES),
    max_size=5,
)
DOCUMENT = st.one_of(CLASS, st.lists(CLASS, min_size=0, max_size=3), st.integers(), st.text())


@settings(max_examples=400, deadline=None)
@given(DOCUMENT)
def test_the_engine_and_the_router_accept_what_the_schema_accepts(document: Any) -> None:
    want = expected_to_parse(document)
    engine, router = parse("engine", document), parse("router", document)
    assert (engine is not None, router is not None) == (want, want), document
    assert engine == router


@pytest.mark.parametrize(
    ("document", "ok"),
    [
        ([{"name": "interactive", "priority": 10, "maxQueueWaitSeconds": "250ms"}], True),
        ({"name": "batch", "maxConcurrency": None, "maxQueue": 0, "maxQueueWaitSeconds": 0}, True),
        ([{"name": "a"}, {"name": "b", "maxQueueWaitSeconds": 1.5}], True),
        ([{"name": "a"}, {"name": "a"}], False),  # names are unique
        ([{}, {}], False),  # two classes named "default"
        ([], False),
        ([{"priority": True}], False),
        ([{"priority": None}], False),
        ([{"maxQueue": None}], False),
        ([{"maxConcurrency": 0}], False),
        ([{"maxQueue": 1.0}], False),
        ([{"name": 7}], False),
        ([{"maxQueueWaitSeconds": -1}], False),
        ([{"maxQueueWaitSeconds": "1e3"}], False),
        ([{"maxQueueWaitSeconds": None}], False),
        ([{"colour": "blue"}], False),
        ([{"max_queue_length": 3, "Max_Queue_Wait": "1s"}], True),
        ([{"name": "chat"}, {"name": "batch", "deadlineSeconds": 3600}], True),
        ([{"deadlineSeconds": 0.5}], True),
        ([{"deadlineSeconds": None}], True),  # interactive
        ([{"deadlineSeconds": 0}], False),
        ([{"deadlineSeconds": -60}], False),
        ([{"deadlineSeconds": "1h"}], False),
        ([{"deadlineSeconds": True}], False),
    ],
)
def test_named_documents(document: Any, ok: bool) -> None:
    assert expected_to_parse(document) == ok
    assert (parse("engine", document) is not None) == ok
    assert (parse("router", document) is not None) == ok


def test_durations_read_alike() -> None:
    for text, seconds in [("250ms", 0.25), ("2s", 2.0), ("1m", 60.0), (" 1.5 ", 1.5), (3, 3.0)]:
        document = {"maxQueueWaitSeconds": text}
        assert valid(document, SCHEMA)
        for parser in PARSERS:
            read = parse(parser, document)
            assert read is not None and math.isclose(read[0]["max_queue_wait_s"], seconds)


# the operator's rendered flag


def _flag(args: list[str]) -> Any:
    return json.loads(args[args.index("--traffic-classes") + 1])


def test_the_operators_rendered_flag_is_valid_and_both_parsers_read_the_spec_from_it() -> None:
    classes = [
        {"name": "interactive", "priority": 10, "maxQueueWaitSeconds": 2},
        {"name": "batch", "priority": 0, "maxQueueWaitSeconds": 0.5},
    ]
    spec = LLMEndpointSpec.model_validate(
        {
            "model": {"name": "tiny", "source": {"hostPath": {"path": "/models/tiny"}}},
            "trafficClasses": classes,
        }
    )
    owner = engine.Owner("chat", "team-a", "uid-1")
    rendered = {
        "engine": _flag(engine_args.kvscale_args(spec)),
        "router": _flag(router_children.router_args(owner, spec)),
    }
    for parser, document in rendered.items():
        assert valid(document, SCHEMA), document
        read = parse(parser, document)
        assert read is not None
        got = [(c["name"], c["priority"], c["max_queue_wait_s"]) for c in read]
        assert got == [(c["name"], c["priority"], c["maxQueueWaitSeconds"]) for c in classes]
