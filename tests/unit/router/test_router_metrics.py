"""A replica that is gone takes its series with it: per-replica labels would otherwise pile up
with every pod a scale-in or a rollout removes."""

from __future__ import annotations

from kvscale_router.metrics import RouterMetrics, version


def _replicas(metrics: RouterMetrics) -> set[str]:
    return {
        sample.labels["replica"]
        for family in metrics.registry.collect()
        for sample in family.samples
        if "replica" in sample.labels
    }


def test_a_gone_replica_loses_every_series_and_a_busy_one_keeps_them() -> None:
    metrics = RouterMetrics()
    for name in ("a", "b", "c"):
        metrics.requests.labels(name, "200").inc()
        metrics.picks.labels(name, "ring").inc()
        metrics.in_flight.labels(name).set(1)
        metrics.outstanding_tokens.labels(name).set(10)
    metrics.upstream_errors.labels("b", "mid_stream").inc()
    metrics.requests.labels("", "429").inc()  # the router's own answer
    metrics.show_weights({"a": 1.0, "b": 0.5, "c": 1.0})
    assert _replicas(metrics) == {"", "a", "b", "c"}

    metrics.show_weights({"a": 1.0}, busy=["c"])
    assert _replicas(metrics) == {"", "a", "c"}
    assert (
        metrics.registry.get_sample_value("kvscale_router_replica_weight", {"replica": "c"}) is None
    )
    assert metrics.registry.get_sample_value("kvscale_router_routable_replicas") == 1

    metrics.show_weights({"a": 1.0})
    assert _replicas(metrics) == {"", "a"}
    assert (
        metrics.registry.get_sample_value(
            "kvscale_router_requests_total", {"replica": "", "code": "429"}
        )
        == 1
    )


def test_build_info_names_the_version() -> None:
    (sample,) = [
        s
        for family in RouterMetrics().registry.collect()
        for s in family.samples
        if s.name == "kvscale_router_build_info"
    ]
    assert sample.value == 1 and sample.labels["version"] == version() != ""
