"""PNG plots of a comparison: replicas against demand over time per policy, and TTFT CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from kvscale.sim.compare import Comparison
from kvscale.sim.recorder import EDGES


def write_plots(c: Comparison, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(c.scenario.trace).name.removesuffix(".csv").removesuffix(".jsonl")
    return [
        _replicas(c, out_dir / f"{stem}-replicas.png"),
        _ttft(c, out_dir / f"{stem}-ttft-cdf.png"),
    ]


def _replicas(c: Comparison, path: Path) -> Path:
    names = list(c.recordings)
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 2.1 * len(names)), sharex=True)
    axes = np.atleast_1d(axes)
    hours = np.arange(len(c.demand_tokens)) / 60.0
    demand = c.demand_tokens / 60.0 / c.oracle_tokens_per_s
    for ax, name in zip(axes, names, strict=True):
        s = c.recordings[name].recorder.series
        ax.fill_between(hours, demand, step="post", color="0.85", label="demand (replicas' worth)")
        ax.step(hours, s["replicas"], where="post", lw=1.0, label="replicas")
        ax.step(hours, s["ready"], where="post", lw=0.8, ls="--", label="ready")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8, ncol=3)
    axes[0].set_title(f"{c.scenario.trace}: replicas vs demand ({c.scenario.profile.name})")
    axes[-1].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ttft(c: Comparison, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    upper = np.r_[EDGES, EDGES[-1] * 10]
    for name, rec in c.recordings.items():
        hist = rec.recorder.ttft.sum(axis=0).astype(float)
        total = hist.sum()
        if total <= 0:
            continue
        ax.plot(upper, np.cumsum(hist) / total, label=name, lw=1.2)
    ax.axvline(c.spec.slo.ttft_p99_seconds, color="k", ls=":", lw=1, label="SLO p99")
    ax.set_xscale("log")
    ax.set_xlim(1e-3, 1e3)
    ax.set_ylim(0.9, 1.0005)
    ax.set_xlabel("time to first token (s), refused = never")
    ax.set_ylabel("CDF (top 10%)")
    ax.set_title(f"{c.scenario.trace}: TTFT CDF per policy")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
