"""The demo's live terminal view (rich): one frame from the latest samples, a pure function.

Replicas desired/ready, routing weights, the queue, p99 TTFT against the SLO and cost per
successful request, each with a sparkline of the run so far, and the capacity loop's last reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .watch import Sample

BARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 48


@dataclass(frozen=True)
class Frame:
    """What the view shows besides the samples: the endpoint, its SLO and the phase clock."""

    endpoint: str
    slo_ttft_s: float
    max_replicas: int
    phase: str
    phase_left_s: float
    phase_rps: float


def sparkline(values: Sequence[float | None], top: float | None = None) -> str:
    """The last SPARK_WIDTH values as block characters (blank where unknown), 0..top."""
    tail = list(values)[-SPARK_WIDTH:]
    known = [v for v in tail if v is not None]
    ceiling = top if top is not None else max(known, default=0.0)
    if ceiling <= 0:
        return "".join(" " if v is None else BARS[0] for v in tail)
    cells = []
    for v in tail:
        if v is None:
            cells.append(" ")
        else:
            cells.append(BARS[min(len(BARS) - 1, int(max(v, 0.0) / ceiling * (len(BARS) - 1)))])
    return "".join(cells)


def _num(value: float | None, fmt: str = "{:.2f}", unknown: str = "-") -> str:
    return unknown if value is None else fmt.format(value)


def _short(pod: str) -> str:
    """`chat-engine-7c9d5b6f4-x2kqz` → `x2kqz` (the part that tells replicas apart)."""
    return pod.rsplit("-", 1)[-1]


def _weights(sample: Sample) -> RenderableType:
    if not sample.weights:
        return Text("none published yet", style="dim")
    grid = Table.grid(padding=(0, 1))
    for pod, weight in sorted(sample.weights.items()):
        bar = "█" * round(weight * 20)
        style = "green" if weight >= 0.5 else "yellow" if weight > 0 else "red"
        label = "draining/warming" if weight == 0 else ""
        grid.add_row(_short(pod), Text(f"{bar:<20}", style=style), f"{weight:.2f}", label)
    return grid


def render(frame: Frame, history: Sequence[Sample]) -> RenderableType:
    """One frame of the live view (the newest sample last in `history`)."""
    now = history[-1] if history else Sample(t=0.0, phase=frame.phase, offered_rps=0.0)
    ttft = now.ttft_p99
    over = ttft is not None and ttft > frame.slo_ttft_s
    table = Table(show_header=True, header_style="bold", expand=True, box=None)
    table.add_column("signal", width=22)
    table.add_column("now", width=26)
    table.add_column(f"the run so far (last {SPARK_WIDTH} samples)")
    table.add_row(
        "replicas desired/ready",
        f"{_num(now.desired, '{:.0f}')} / {_num(now.ready, '{:.0f}')}  (max {frame.max_replicas})",
        sparkline([s.desired for s in history], float(frame.max_replicas)),
    )
    table.add_row(
        "load offered",
        f"{now.offered_rps:g} req/s",
        sparkline([s.offered_rps for s in history]),
    )
    table.add_row(
        "tokens/s served (1 min)",
        _num(now.tokens_per_s, "{:.0f}"),
        sparkline([s.tokens_per_s for s in history]),
    )
    table.add_row(
        "queue waiting/running",
        f"{_num(now.waiting, '{:.0f}')} / {_num(now.running, '{:.0f}')}"
        f"  (held by router {_num(now.held, '{:.0f}')})",
        sparkline([s.waiting for s in history]),
    )
    table.add_row(
        "p99 TTFT (1 min)",
        Text(
            f"{_num(ttft)} s vs SLO {frame.slo_ttft_s:g} s",
            style="bold red" if over else "green",
        ),
        sparkline([s.ttft_p99 for s in history], 2 * frame.slo_ttft_s),
    )
    table.add_row(
        "SLO attainment",
        _num(None if now.attainment is None else 100 * now.attainment, "{:.0f} %"),
        "share of recent capacity intervals within the SLO (operator)",
    )
    table.add_row(
        "cost / successful request",
        f"{_num(now.cost_per_request, '{:.6f}')} {now.currency}",
        sparkline([s.cost_per_request for s in history]),
    )
    why = Text.assemble(
        ("capacity loop: ", "bold"),
        (now.reason or "no decision yet", "cyan"),
        f"  {now.message}" if now.message else "",
    )
    title = (
        f"kvscale demo · LLMEndpoint {frame.endpoint} · phase [bold]{frame.phase}[/bold] "
        f"({frame.phase_rps:g} req/s, {max(frame.phase_left_s, 0):.0f} s left) · t={now.t:.0f} s"
    )
    weights = Panel(_weights(now), title="routing weights (published by the operator)")
    return Panel(Group(table, weights, why), title=title, border_style="blue")
