"""Published weights, the warm-up rule for unweighted pods, and the replica table."""

from __future__ import annotations

import pytest

from kvscale_router.replicas import Pod, ReplicaTable
from kvscale_router.static_source import parse_replicas
from kvscale_router.weights import (
    Published,
    WeightsError,
    effective_weight,
    from_configmap,
    parse_weights,
)


def test_weights_parse_from_the_configmap_format() -> None:
    published = parse_weights(
        '{"weights": {"p-1": 0.5, "p-2": 0}, "updatedAt": "2026-01-01T00:00:00Z", "reason": "x"}'
    )
    assert published.weights == {"p-1": 0.5, "p-2": 0.0}
    assert published.updated_at == "2026-01-01T00:00:00Z" and published.reason == "x"
    assert from_configmap(None) is None and from_configmap({"weights.json": " "}) is None
    assert from_configmap({"weights.json": '{"weights": {}}'}) == Published({})


@pytest.mark.parametrize(
    "text",
    ["nope", "[]", '{"weights": []}', '{"weights": {"a": "1"}}', '{"weights": {"a": 1.5}}',
     '{"weights": {"a": -0.1}}', '{"weights": {"a": true}}', '{"weights": {"a": NaN}}'],
)  # fmt: skip
def test_bad_weights_are_refused(text: str) -> None:
    with pytest.raises(WeightsError):
        parse_weights(text)


def test_token_budgets_are_optional_and_checked() -> None:
    assert parse_weights('{"weights": {"a": 1}}').token_budgets == {}
    published = parse_weights('{"weights": {"a": 1}, "tokenBudgets": {"a": 4096, "b": 0}}')
    assert published.token_budgets == {"a": 4096.0, "b": 0.0}
    for bad in ("[1]", '{"a": -1}', '{"a": "9"}', '{"a": Infinity}', '{"a": false}'):
        with pytest.raises(WeightsError):
            parse_weights(f'{{"weights": {{}}, "tokenBudgets": {bad}}}')


def test_unweighted_pods_join_after_the_warmup() -> None:
    published = Published({"a": 0.3})
    assert effective_weight("a", 0.0, published, 10) == 0.3
    assert effective_weight("b", 9.9, published, 10) == 0.0
    assert effective_weight("b", 10.0, published, 10) == 1.0
    assert effective_weight("b", 10.0, None, 10) == 1.0


def test_table_reports_routable_pods_and_the_next_warm_up() -> None:
    now = [1000.0]
    table = ReplicaTable(warmup_s=10, clock=lambda: now[0])
    removed: list[set[str]] = []
    table.on_removed(removed.append)
    table.set_pods({"a": Pod("a", "http://a", 0.0), "b": Pod("b", "http://b", 995.0)})
    assert table.routable() == {"a": 1.0}
    assert table.next_warm_s() == pytest.approx(5.0)
    now[0] = 1005.0
    assert table.routable() == {"a": 1.0, "b": 1.0} and table.next_warm_s() is None
    table.set_published(Published({"a": 0.0}))
    assert table.routable() == {"b": 1.0}
    table.set_pods({"b": table.pods["b"]})
    assert removed == [{"a"}]


def test_static_replicas_parse() -> None:
    assert parse_replicas("a=http://h:1, http://h:2/") == {"a": "http://h:1", "h:2": "http://h:2"}
    for bad in ("", "ftp://x", "a=http://h:1,a=http://h:2", "a=h:1"):
        with pytest.raises(ValueError):
            parse_replicas(bad)


def test_the_router_reads_what_the_operator_publishes() -> None:
    """The wire contract: the routing law's publication parses into the same weights."""
    from kvscale.controllers import routing

    decision = routing.decide(("p-0", "p-1"), [], {"p-1": 0.5}, ("p-0",), routing.RoutingState())
    published = from_configmap({"weights.json": routing.publication(decision, 1e9)})
    assert published is not None
    assert published.weights == {"p-0": 0.0, "p-1": 0.55}
    assert published.reason == routing.DRAINING and published.updated_at == "2001-09-09T01:46:40Z"


def test_operator_and_router_agree_on_the_key_and_the_port() -> None:
    """The router's defaults are the operator's constants (the packages may not import each
    other, so this test holds them together)."""
    from kvscale.children.router import ROUTER_PORT
    from kvscale.controllers import routing
    from kvscale_router import cli, weights

    assert routing.WEIGHTS_KEY == weights.WEIGHTS_KEY
    assert ROUTER_PORT == cli.ROUTER_PORT


def test_the_router_reads_the_token_budgets_the_operator_publishes() -> None:
    """A replica's budget is its weight x its capacity at the SLO x the TTFT target: 500
    tokens/s within 2 s is 1000 outstanding tokens; a replica starting its warm-up a tenth."""
    from kvscale.controllers import routing

    params = routing.RoutingParams(ttft_slo_s=2.0, replica_tokens_per_s=500.0)
    decision = routing.decide(("p-0", "p-1"), [], {"p-1": 0.0}, (), routing.RoutingState(), params)
    published = from_configmap({"weights.json": routing.publication(decision, 1e9)})
    assert published is not None
    assert published.token_budgets == {"p-0": 1000.0, "p-1": 100.0}
