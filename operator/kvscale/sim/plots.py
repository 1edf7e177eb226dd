"""PNG plots of a comparison: replicas against demand over time per policy, TTFT CDFs, and with a
sweep the Pareto plot of every baseline setting (GPU-hours against SLO minutes, judged part)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

from kvscale.sim import tuning
from kvscale.sim.compare import Comparison
from kvscale.sim.recorder import EDGES


def write_plots(c: Comparison, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = Path(c.scenario.trace).name.removesuffix(".csv").removesuffix(".jsonl")
    paths = [
        _replicas(c, out_dir / f"{stem}-replicas.png"),
        _ttft(c, out_dir / f"{stem}-ttft-cdf.png"),
    ]
    if c.sweeps:
        paths.append(_pareto(c, out_dir / f"{stem}-pareto.png"))
    return paths


def _pareto(c: Comparison, path: Path) -> Path:
    """Each baseline's sweep as a line (its default hollow, its tuned pick ringed), kvscale and
    the oracle as single points; the judged part of the trace."""
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for name, sweep in c.sweeps.items():
        x = [o.judged.gpu_hours for o in sweep]
        y = [o.judged.slo_minutes_fraction for o in sweep]
        (line,) = ax.plot(x, y, "o-", lw=1, ms=4, label=name)
        for o in sweep:
            if o.setting.default:
                ax.plot(o.judged.gpu_hours, o.judged.slo_minutes_fraction, "o", ms=10,
                        mfc="none", color=line.get_color())  # fmt: skip
        pick = tuning.pick(sweep)
        if pick is not None:
            ax.plot(pick.judged.gpu_hours, pick.judged.slo_minutes_fraction, "s", ms=11,
                    mfc="none", mew=2, color=line.get_color())  # fmt: skip
    for name, marker in (("kvscale", "*"), ("oracle", "D")):
        if name in c.recordings:
            judged = tuning.parts(c.recordings[name], c.spec, c.tune_minutes)[1]
            ax.plot(judged.gpu_hours, judged.slo_minutes_fraction, marker, ms=14, color="k",
                    label=name)  # fmt: skip
    ax.axhline(tuning.TUNE_GOAL, color="k", ls=":", lw=1)
    ax.set_xlabel(f"GPU-hours after the {c.tune_minutes}-minute tuning window")
    ax.set_ylabel("share of minutes within the SLO (judged part)")
    ax.set_title(
        f"{c.scenario.trace}: baseline sweeps (hollow: default, square: tuned pick)", fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
