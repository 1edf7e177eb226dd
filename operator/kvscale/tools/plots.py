"""PNG plots of a load-test run: latency CDFs, throughput over time, server queue depth."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvscale.tools.client import RequestRecord
from kvscale.tools.promtext import total
from kvscale.tools.report import Samples


def write_plots(
    records: Sequence[RequestRecord],
    timeline: Sequence[tuple[float, Samples]],
    out_dir: Path,
    title: str,
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _latency_cdfs(records, out_dir / "latency_cdf.png", title),
        _throughput(records, out_dir / "throughput.png", title),
        _queue_depth(records, timeline, out_dir / "queue_depth.png", title),
    ]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cdf(ax: Axes, values_s: Sequence[float], label: str) -> None:
    if not values_s:
        ax.text(0.5, 0.5, "no data", ha="center", transform=ax.transAxes)
        return
    xs = np.sort(np.asarray(values_s) * 1000.0)
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.plot(xs, ys, label=label)
    ax.axhline(0.99, color="grey", lw=0.6, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel(f"{label} (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)


def _latency_cdfs(records: Sequence[RequestRecord], path: Path, title: str) -> Path:
    done = [r for r in records if r.ok]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    _cdf(axes[0], [r.ttft_s for r in done if r.ttft_s is not None], "TTFT")
    _cdf(axes[1], [x for r in done for x in r.itls_s], "ITL")
    _cdf(axes[2], [r.e2e_s for r in done], "E2E latency")
    fig.suptitle(f"{title}: latency CDFs ({len(done)} completed)")
    return _save(fig, path)


def _bins(records: Sequence[RequestRecord]) -> np.ndarray:
    """About 60 bins over the run: 1 s wide for a minute-long run, finer for shorter ones."""
    end = max((r.end_s for r in records), default=1.0)
    width = max(0.05, float(f"{end / 60:.1g}")) if end < 60 else math.ceil(end / 60)
    return np.arange(0.0, end + width, width)


def _throughput(records: Sequence[RequestRecord], path: Path, title: str) -> Path:
    bins = _bins(records)
    done = [r for r in records if r.ok]
    # output tokens spread over each request's decode time
    tokens = np.zeros(len(bins) - 1)
    for r in done:
        first = r.start_s + (r.ttft_s or 0.0)
        span = max(r.end_s - first, 1e-6)
        overlap = np.clip(np.minimum(bins[1:], r.end_s) - np.maximum(bins[:-1], first), 0, None)
        tokens += r.output_tokens * overlap / span
    width = bins[1] - bins[0]
    tokens /= width
    finished = np.histogram([r.end_s for r in done], bins)[0] / width
    refused = np.histogram([r.end_s for r in records if r.refused], bins)[0] / width
    fig, ax = plt.subplots(figsize=(10, 3.8))
    ax.plot(bins[:-1], tokens, label="output tokens/s")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("tokens/s")
    twin = ax.twinx()
    twin.step(bins[:-1], finished, where="post", color="tab:green", label="completed/s")
    twin.step(bins[:-1], refused, where="post", color="tab:red", label="refused/s")
    twin.set_ylabel("requests/s")
    fig.legend(loc="upper right")
    ax.set_title(f"{title}: throughput over time")
    return _save(fig, path)


def _queue_depth(
    records: Sequence[RequestRecord],
    timeline: Sequence[tuple[float, Samples]],
    path: Path,
    title: str,
) -> Path:
    fig, ax = plt.subplots(figsize=(10, 3.8))
    times = [t for t, _ in timeline]
    for metric, label in (
        ("vllm:num_requests_waiting", "server waiting"),
        ("vllm:num_requests_running", "server running"),
    ):
        values = [total(s, metric) for _, s in timeline]
        if any(v is not None for v in values):
            ax.plot(times, [v or 0.0 for v in values], label=label)
    bins = _bins(records)
    in_flight = [sum(r.start_s <= t < r.end_s for r in records) for t in bins]
    ax.step(bins, in_flight, where="post", label="client in flight", alpha=0.6)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("requests")
    usage = [total(s, "vllm:kv_cache_usage_perc") for _, s in timeline]
    if any(u is not None for u in usage):
        twin = ax.twinx()
        twin.plot(times, [u or 0.0 for u in usage], color="tab:purple", ls="--", label="KV usage")
        twin.set_ylim(0, 1.05)
        twin.set_ylabel("KV cache usage")
    fig.legend(loc="upper right")
    ax.set_title(f"{title}: queue depth and KV usage")
    return _save(fig, path)
