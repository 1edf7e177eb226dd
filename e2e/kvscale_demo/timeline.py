"""The demo's timeline: every sample of the run in one PNG (matplotlib) and one JSON file.

Five stacked panels over the same time axis, the load phases shaded behind them: load offered and
tokens served; replicas desired and ready; each replica's routing weight; the queue; p99 TTFT
against the SLO; cost per successful request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .watch import Sample

PHASE_COLOURS = ("#e8f0fe", "#fef7e0", "#fce8e6", "#e6f4ea", "#f3e8fd")


def _series(samples: Sequence[Sample], key: str) -> tuple[list[float], list[float]]:
    """(t, value) for the samples where `key` is known."""
    found = [(s.t, getattr(s, key)) for s in samples if getattr(s, key) is not None]
    return [t for t, _ in found], [float(v) for _, v in found]


def phases(samples: Sequence[Sample]) -> list[tuple[str, float, float]]:
    """(phase, start, end) spans in the order they ran."""
    spans: list[tuple[str, float, float]] = []
    for s in samples:
        if spans:  # a phase lasts until the next one's first sample
            name, start, _ = spans[-1]
            spans[-1] = (name, start, s.t)
        if not spans or spans[-1][0] != s.phase:
            spans.append((s.phase, s.t, s.t))
    return spans


def write_json(samples: Sequence[Sample], path: Path) -> None:
    path.write_text(json.dumps([s.to_dict() for s in samples], indent=1))


def plot(samples: Sequence[Sample], slo_ttft_s: float, title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(6, 1, figsize=(11, 14), sharex=True)
    load, replicas, weights, queue, ttft, cost = axes
    for ax in axes:
        for i, (name, start, end) in enumerate(phases(samples)):
            ax.axvspan(start, end, color=PHASE_COLOURS[i % len(PHASE_COLOURS)], lw=0)
            if ax is load:
                ax.text((start + end) / 2, 1.02, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="bottom", fontsize=9)  # fmt: skip
        ax.grid(alpha=0.3)

    load.step(*_series(samples, "offered_rps"), where="post", label="offered (req/s)")
    served = load.twinx()
    served.plot(*_series(samples, "tokens_per_s"), color="tab:green", label="served (tokens/s)")
    served.plot(*_series(samples, "demand"), color="tab:olive", ls="--", label="demand (tokens/s)")
    served.set_ylabel("tokens/s")
    load.set_ylabel("req/s")
    load.legend(loc="upper left", fontsize=8)
    served.legend(loc="upper right", fontsize=8)

    replicas.step(*_series(samples, "desired"), where="post", label="desired", lw=2)
    replicas.step(*_series(samples, "ready"), where="post", label="ready", ls="--")
    replicas.set_ylabel("replicas")
    replicas.set_ylim(bottom=0)
    replicas.legend(loc="upper left", fontsize=8)

    pods = sorted({pod for s in samples for pod in s.weights})
    for pod in pods:
        points = [(s.t, s.weights[pod]) for s in samples if pod in s.weights]
        weights.step([t for t, _ in points], [w for _, w in points], where="post",
                     label=pod.rsplit("-", 1)[-1])  # fmt: skip
    weights.set_ylabel("routing weight")
    weights.set_ylim(-0.05, 1.05)
    if pods:
        weights.legend(loc="upper left", fontsize=8, ncol=4)

    queue.plot(*_series(samples, "waiting"), label="waiting")
    queue.plot(*_series(samples, "running"), label="running")
    queue.plot(*_series(samples, "held"), label="held by the router")
    queue.set_ylabel("requests")
    queue.legend(loc="upper left", fontsize=8)

    ttft.plot(*_series(samples, "ttft_p99"), label="p99 TTFT (Prometheus, 1 min)")
    ttft.plot(*_series(samples, "operator_ttft_p99"), ".", ms=3,
              label="p99 TTFT (operator, per interval)")  # fmt: skip
    ttft.axhline(slo_ttft_s, color="tab:red", ls="--", label=f"SLO {slo_ttft_s:g} s")
    ttft.set_ylabel("seconds")
    ttft.legend(loc="upper left", fontsize=8)

    cost.plot(*_series(samples, "cost_per_request"), color="tab:purple")
    currency = samples[-1].currency if samples else ""
    cost.set_ylabel(f"{currency} / successful request")
    cost.set_xlabel("seconds since the load began")

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
