"""The pure parts of `make demo`: a sample from an endpoint's status, the live view's frame,
sparklines, the phases of a run and its PNG timeline."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from kvscale_demo.timeline import phases, plot
from kvscale_demo.view import BARS, SPARK_WIDTH, Frame, render, sparkline
from kvscale_demo.watch import Sample, from_status

STATUS = {
    "desiredReplicas": 3,
    "replicas": 3,
    "readyReplicas": 2,
    "capacity": {
        "reason": "DemandForecast",
        "message": "Scaling up for demand 400 tokens/s",
        "demandTokensPerSecond": 400.0,
        "perReplicaTokensPerSecond": 150.0,
    },
    "routing": {"weights": {"chat-engine-7c9d5b6f4-x2kqz": 1.0, "chat-engine-7c9d5b6f4-ab3de": 0}},
    "slo": {"ttftP99Seconds": 0.8, "attainment": 0.75},
    "cost": {"perSuccessfulRequest": 0.00012, "currency": "EUR"},
}


def _run() -> list[Sample]:
    samples = []
    for i in range(30):
        phase, rate = ("rise", 1.5) if i < 10 else ("burst", 6.0) if i < 20 else ("quiet", 0.2)
        base = from_status(2.0 * i, phase, rate, STATUS)
        samples.append(
            Sample(**{**base.to_dict(), "ttft_p99": 0.1 * i, "waiting": i % 4, "running": 2})
        )
    return samples


def test_a_sample_reads_the_status_fields() -> None:
    sample = from_status(12.0, "burst", 6.0, STATUS)
    assert (sample.desired, sample.replicas, sample.ready) == (3, 3, 2)
    assert sample.weights == {"chat-engine-7c9d5b6f4-x2kqz": 1.0, "chat-engine-7c9d5b6f4-ab3de": 0}
    assert sample.reason == "DemandForecast" and sample.demand == 400.0
    assert sample.cost_per_request == 0.00012 and sample.currency == "EUR"
    assert sample.attainment == 0.75 and sample.operator_ttft_p99 == 0.8


def test_an_endpoint_without_status_gives_an_empty_sample() -> None:
    sample = from_status(0.0, "steady", 0.5, {})
    assert sample.desired is None and sample.weights == {} and sample.reason == ""


def test_sparkline_scales_to_the_top_and_keeps_gaps() -> None:
    assert sparkline([0, None, 1, 2], top=2) == BARS[0] + " " + BARS[3] + BARS[-1]
    assert len(sparkline(list(range(100)))) == SPARK_WIDTH
    assert sparkline([None, None]) == "  "


def test_the_frame_shows_every_signal() -> None:
    console = Console(width=160, record=True)
    frame = Frame("demo/chat", slo_ttft_s=2.0, max_replicas=3, phase="burst", phase_left_s=40,
                  phase_rps=6.0)  # fmt: skip
    console.print(render(frame, _run()))
    text = console.export_text()
    for expected in ("3 / 2", "(max 3)", "x2kqz", "ab3de", "draining/warming", "2.90 s vs SLO 2 s",
                     "0.000120 EUR", "75 %", "DemandForecast", "phase burst"):  # fmt: skip
        assert expected in text, expected


def test_phases_span_until_the_next_one_begins() -> None:
    assert phases(_run()) == [("rise", 0.0, 20.0), ("burst", 20.0, 40.0), ("quiet", 40.0, 58.0)]


def test_the_timeline_is_a_png(tmp_path: Path) -> None:
    path = plot(_run(), 2.0, "a run", tmp_path / "timeline.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
