"""A replica that is gone takes its series with it: per-replica labels would otherwise pile up
with every pod a scale-in or a rollout removes."""

from __future__ import annotations

from kvscale_router.metrics import FORGET_AFTER_S, RouterMetrics, version


def _replicas(metrics: RouterMetrics) -> set[str]:
    return {
        sample.labels["replica"]
        for family in metrics.registry.collect()
        for sample in family.samples
        if "replica" in sample.labels
    }


def weight(metrics: RouterMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value("kvscale_router_replica_weight", {"replica": name})


def test_a_gone_replica_loses_every_series_once_idle_and_missing_for_a_while() -> None:
    metrics = RouterMetrics()
    for name in ("a", "b", "c"):
        metrics.requests.labels(name, "200").inc()
        metrics.picks.labels(name, "ring").inc()
        metrics.in_flight.labels(name).set(1)
        metrics.outstanding_tokens.labels(name).set(10)
    metrics.upstream_errors.labels("b", "mid_stream").inc()
    metrics.requests.labels("", "429").inc()  # the router's own answer
    metrics.show_weights({"a": 1.0, "b": 0.5, "c": 1.0}, now=0.0)
    assert _replicas(metrics) == {"", "a", "b", "c"}

    # b and c leave the weights (deleted, or not Ready): weight 0 at once, series kept, so the
    # errors of b's last moments are still scraped and a restart does not reset its counters
    metrics.show_weights({"a": 1.0}, busy=["c"], now=1.0)
    assert _replicas(metrics) == {"", "a", "b", "c"}
    assert weight(metrics, "b") == 0 and weight(metrics, "c") == 0
    assert metrics.registry.get_sample_value("kvscale_router_routable_replicas") == 1

    # b is back before the grace runs out: nothing was lost
    metrics.show_weights({"a": 1.0, "b": 1.0}, busy=["c"], now=1.0 + FORGET_AFTER_S / 2)
    assert weight(metrics, "b") == 1.0
    errors = {"replica": "b", "kind": "mid_stream"}
    assert metrics.registry.get_sample_value("kvscale_router_upstream_errors_total", errors) == 1

    # c stayed busy, then idle past the grace: its series go; a stays, b is gone past it too
    metrics.show_weights({"a": 1.0}, now=2.0 + FORGET_AFTER_S)
    assert _replicas(metrics) == {"", "a", "b", "c"}  # c and b only now idle and missing
    metrics.show_weights({"a": 1.0}, now=3.0 + 2 * FORGET_AFTER_S)
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
