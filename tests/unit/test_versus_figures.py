"""The kvscale-vs-KEDA figures (e2e/kvscale_demo/figures.py) on a scripted run, and the specs,
Deployments and ScaledObjects the comparison deploys (versus.py)."""

from __future__ import annotations

import pytest

from kvscale_demo.figures import cheapest_no_worse, measure
from kvscale_demo.trace_slice import scaled_trace, trace_slice
from kvscale_demo.versus import (
    KedaTuning,
    Request,
    Run,
    Sample,
    endpoint_spec,
    plain_children,
    scaled_object,
    status_error,
)

# a 60 s run: one pod for 10 s, the burst at t=10, a second pod asked for at t=14 and Ready at
# t=20, asked away at t=40 and gone at t=44
SAMPLES = [
    Sample(t=float(t), desired=d, replicas=r, ready=rd)
    for t, d, r, rd in [
        (0, 1, 1, 1), (10, 1, 1, 1), (14, 2, 2, 1), (20, 2, 2, 2),
        (40, 1, 2, 1), (44, 1, 1, 1), (60, 1, 1, 1),
    ]
]  # fmt: skip


def run(*requests: Request) -> Run:
    return Run("scripted", [("steady", 0, 10), ("burst", 10, 40), ("quiet", 40, 60)],
               list(requests), SAMPLES)  # fmt: skip


def test_replica_seconds_changes_and_the_first_added_ready_replica() -> None:
    figures = measure(run(Request(1, 2, 0.1, None)))
    # 1 pod for 14 s, 2 for 30 s, 1 for 16 s
    assert figures["replica_seconds"] == 14 + 60 + 16
    assert figures["scaling_changes"] == 2
    assert figures["max_replicas"] == 2 and figures["final_replicas"] == 1
    assert figures["burst_to_first_added_ready_s"] == 10.0
    assert figures["scale_in_windows"] == 1


def test_failures_in_the_scale_in_window_are_counted_apart() -> None:
    figures = measure(
        run(
            Request(30, 31, 0.2, "ReadError: cut"),  # during the burst, before any scale-in
            Request(38, 42, 0.2, "stream cut before [DONE]"),  # ended while a pod went away
            Request(50, 51, 0.2, None),
        )
    )
    assert figures["failed"] == 2
    assert figures["failed_in_scale_in"] == 1
    assert figures["phases"]["burst"]["failed"] == 2


def test_slo_share_counts_intervals_with_a_late_or_failed_request() -> None:
    figures = measure(
        run(
            Request(1, 2, 0.1, None),
            Request(12, 20, 3.5, None),  # above the 2 s SLO: interval 10-20 misses
            Request(25, 26, 0.1, "HTTP 503"),  # interval 20-30 misses
        )
    )
    assert figures["slo_intervals"] == 6
    assert figures["slo_share"] == round(4 / 6, 3)
    assert figures["phases"]["burst"]["p99_ttft_s"] == 3.5


def test_a_lead_in_before_the_first_phase_is_left_out_of_every_figure() -> None:
    # 30 s of lead-in before t=0: a pod added and a request refused there count nowhere
    lead = [Sample(t=-30.0, desired=1, replicas=1, ready=1), Sample(-20.0, 3, 3, 1),
            Sample(-15.0, 1, 3, 1), Sample(-10.0, 1, 1, 1)]  # fmt: skip
    early = Request(-25, -24, None, "HTTP 429 (deadline)")
    scripted = run(early, Request(1, 2, 0.1, None))
    scripted.samples = [*lead, *SAMPLES]
    figures = measure(scripted)
    assert figures["requests"] == 1 and figures["failed"] == 0 and figures["refused"] == 0
    assert figures["replica_seconds"] == 14 + 60 + 16  # from t=0 on, as without the lead-in
    assert figures["slo_share"] == 1.0
    assert figures["scaling_changes"] == 2  # the lead-in's 1 -> 3 -> 1 is not one of them
    assert figures["scale_in_windows"] == 1 and figures["max_replicas"] == 2
    # the same request inside the phases is counted
    assert measure(run(Request(25, 26, None, "HTTP 429 (deadline)")))["refused"] == 1


def test_keda_serves_the_deployment_kvscale_renders_without_an_owner() -> None:
    deployment, service = plain_children("ns", endpoint_spec())
    assert "ownerReferences" not in deployment["metadata"]
    assert deployment["metadata"]["name"] == "chat-engine" and deployment["spec"]["replicas"] == 1
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    so = scaled_object("ns", "http://prom:9090", KedaTuning(threshold=2))
    trigger = so["spec"]["triggers"][0]
    assert trigger["metadata"]["query"] == 'sum(vllm:num_requests_waiting{namespace="ns"})'
    assert trigger["metadata"]["threshold"] == "2"
    assert so["spec"]["scaleTargetRef"]["name"] == "chat-engine"


def test_a_failure_names_whose_answer_it_was_and_429s_count_as_refused() -> None:
    router = b'{"error": {"message": "No replica could take the request (tried 1).", '
    router += b'"type": "service_unavailable", "code": "no_replica"}}'
    assert status_error(503, router) == "HTTP 503 (no_replica)"
    assert status_error(429, b'{"error": {"type": "rate_limit_exceeded"}}') == (
        "HTTP 429 (rate_limit_exceeded)"
    )
    assert status_error(500, b'{"object": "error", "type": "InternalServerError"}') == (
        "HTTP 500 (InternalServerError)"
    )
    assert status_error(502, b"<html>Bad Gateway</html>") == "HTTP 502"
    assert status_error(503, b"[]") == "HTTP 503"
    figures = measure(run(Request(12, 13, None, "HTTP 429 (rate_limit_exceeded)"),
                          Request(14, 15, None, "HTTP 503 (no_replica)")))  # fmt: skip
    assert figures["failed"] == 2 and figures["refused"] == 1


def test_the_vllm_shape_is_the_same_endpoint_on_vllm_and_keda_serves_it_alike() -> None:
    spec = endpoint_spec(500.0, engine="vllm")
    assert spec["engine"]["kind"] == "vllm"
    assert spec["model"]["source"] == {"hostPath": {"path": "/tmp/kvscale/models/llama-hd64"}}
    for key in ("scaling", "slo"):  # what the autoscalers see and judge by is unchanged
        assert spec[key] == endpoint_spec(500.0)[key]
    assert spec["engine"]["maxNumSeqs"] == endpoint_spec()["engine"]["maxNumSeqs"]
    deployment, _ = plain_children("ns", spec)
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    assert engine["image"].startswith("vllm/vllm-openai")


def test_the_like_for_like_baseline_is_the_cheapest_run_at_no_lower_slo_share() -> None:
    figures = {
        "kvscale": {"replica_seconds": 550.0, "slo_share": 0.83},
        "cheap-but-worse": {"replica_seconds": 490.0, "slo_share": 0.72},
        "dear": {"replica_seconds": 1100.0, "slo_share": 0.88},
        "just-as-good": {"replica_seconds": 700.0, "slo_share": 0.83},
    }
    assert cheapest_no_worse(figures, "kvscale") == "just-as-good"
    del figures["just-as-good"], figures["dear"]
    assert cheapest_no_worse(figures, "kvscale") is None


def test_a_trace_slice_is_the_window_that_asks_most_and_keeps_its_shape() -> None:
    # 30 s steps: 10 arrivals each, except a burst of 40 in the 7th step (t = 180-210 s)
    arrivals = [s * 30.0 + i * 30.0 / n for s in range(12) for n in [40 if s == 6 else 10]
                for i in range(n)]  # fmt: skip
    part = trace_slice(arrivals, minutes=2.0)  # 4 steps
    assert part.start_s == 90.0  # steps 3-6: the burst at the end, the earliest such window
    assert [p.rate for p in part.phases] == [0.25, 0.25, 0.25, 1.0]
    assert part.peak_to_mean == round(40 / 17.5, 3)
    assert [p.seconds for p in part.phases] == [30.0] * 4
    # scaled: the busiest step at 1.5x what one replica serves
    assert [p.rate for p in scaled_trace(part, capacity=4.0)] == [1.5, 1.5, 1.5, 6.0]


def test_a_trace_slice_longer_than_the_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        trace_slice([0.0, 10.0, 50.0], minutes=5.0)
    with pytest.raises(ValueError, match="no arrivals"):
        trace_slice([], minutes=1.0)
