"""`kvscale simulate`: replay a trace against the capacity law and the baselines, side by side.

Every policy gets the same workload, the same endpoint spec, the same engine profile and the same
seed; the report says per policy what the GPUs cost and what users saw (see kvscale.sim.report),
as JSON (and a table on stdout), with PNG plots next to it.

`--mixed` runs issue 21's mixed workload instead (kvscale.sim.mixed, as `python -m
bench.capacity_sim --mixed` does): ServeGen chat plus daily deferrable batch jobs of Azure code
requests (4 h and 1 h deadlines), served with deferral, all as interactive, and as two pools.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.sim.compare import POLICIES, Scenario, compare
from kvscale.sim.mixed import DAY_S, JOBS, MixedScenario, compare_mixed
from kvscale.sim.profile import ProfileError, load_profile, shipped
from kvscale.sim.run import LEAD_IN_S, Settings
from kvscale.tools import tool_parser
from kvscale.traces import TraceError, default_traces_dir

DEFAULT_PROFILE = "h200-kvscale-eager"


def add_simulate_parser(sub: Any) -> None:
    summary = "replay a trace against kvscale's capacity law and baseline autoscalers"
    p = tool_parser(sub, "simulate", summary, __doc__)
    p.add_argument(
        "--trace",
        help="azure-conv, azure-code, mooncake, servegen-m-large, or a file (Azure CSV, "
        "Mooncake JSONL, ServeGen 10-minute aggregate CSV); required without --mixed",
    )
    p.add_argument(
        "--mixed",
        action="store_true",
        help="the mixed workload (ServeGen chat + daily Azure-code batch jobs with deadlines) "
        "served with deferral, all as interactive, and as two pools; defaults as the "
        "capacity_sim bench: 24 h, --rate-scale 0.1, --dt 2",
    )
    p.add_argument(
        "--batch-share",
        type=float,
        default=0.25,
        help="--mixed: the batch jobs' share of all tokens (default 0.25)",
    )
    p.add_argument(
        "--batch-at",
        default=",".join(f"{start / 3600:g}" for _, start, _ in JOBS),
        help="--mixed: hours of the day the 4 h and the 1 h batch job are submitted "
        "(default %(default)s)",
    )
    p.add_argument(
        "--traces-dir",
        type=Path,
        default=None,
        help="default: $KVSCALE_TRACES_DIR, else ~/.cache/kvscale/traces",
    )
    p.add_argument(
        "--length-trace",
        default="azure-conv",
        help="request lengths for ServeGen's rate-only trace (default azure-conv)",
    )
    p.add_argument(
        "--hours",
        type=float,
        default=None,
        help="simulated hours (the trace loops); default: the trace's length",
    )
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="compress the trace's time by this factor"
    )
    p.add_argument(
        "--rate-scale",
        type=float,
        default=None,
        help="multiply the request rate (copies or thins requests); default 1 (0.1 --mixed)",
    )
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"engine profile: a shipped name ({', '.join(shipped())}) or a JSON file",
    )
    p.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="an LLMEndpoint YAML whose spec drives every policy (default: derived "
        "from the trace and profile as `kvscale plan` recommends)",
    )
    p.add_argument("--ttft-slo", type=float, default=2.0, help="p99 TTFT target, s (no --spec)")
    p.add_argument("--itl-slo", type=float, default=0.2, help="p99 ITL target, s (no --spec)")
    p.add_argument(
        "--gpu-hour-price",
        type=float,
        default=3.5,
        help="price of a GPU-hour (no --spec; an assumed on-demand price)",
    )
    p.add_argument(
        "--no-prior",
        action="store_true",
        help="leave scaling.replicaCapacityTokensPerSecond unset (no --spec)",
    )
    p.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated subset of {','.join(POLICIES)}",
    )
    p.add_argument(
        "--tune",
        action="store_true",
        help="also sweep each baseline's knob, pick per trace the cheapest setting that meets "
        "the SLO in >= 99%% of the tuning window's minutes (the first quarter, or ServeGen's day "
        "1) and judge it on the rest (kvscale keeps its defaults)",
    )
    p.add_argument(
        "--dt",
        type=float,
        default=None,
        help="simulation step, s (divides 600); default 1 (2 --mixed)",
    )
    p.add_argument("--scrape-interval", type=float, default=15.0, help="metrics scrape, s")
    p.add_argument(
        "--scrape-delay",
        type=float,
        default=0.0,
        help="extra age of the newest sample a decision sees, s",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--lead-in",
        type=float,
        default=LEAD_IN_S,
        help="seconds each policy runs on the looped trace's end before the recorded run starts "
        "(0: from a fleet sized for the first minute, with nothing learned)",
    )
    p.add_argument("--jobs", type=int, default=1, help="policies run in parallel processes")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path("simulate-out"),
        help="where the JSON report and PNG plots go",
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_simulate)


def scenario_from(args: argparse.Namespace) -> Scenario:
    names = tuple(n.strip() for n in args.policies.split(",") if n.strip())
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    if not args.trace:
        raise ValueError("--trace is required (or --mixed)")
    dt = _dt(args, 1.0)
    if args.lead_in < 0:
        raise ValueError("--lead-in must not be negative")
    return Scenario(
        trace=args.trace,
        traces_dir=args.traces_dir or default_traces_dir(),
        profile=load_profile(args.profile),
        hours=args.hours,
        time_scale=args.time_scale,
        rate_scale=args.rate_scale if args.rate_scale is not None else 1.0,
        length_trace=args.length_trace,
        ttft_slo_s=args.ttft_slo,
        itl_slo_s=args.itl_slo,
        gpu_hour_price=args.gpu_hour_price,
        prior=not args.no_prior,
        spec=read_spec(args.spec) if args.spec else None,
        settings=Settings(dt, args.scrape_interval, args.scrape_delay, args.seed, args.lead_in),
        policies=names,
        tune=args.tune,
    )


def mixed_scenario_from(args: argparse.Namespace) -> MixedScenario:
    """The mixed comparison's scenario, with the capacity_sim bench's settings by default."""
    try:
        starts = [float(h) * 3600 for h in args.batch_at.split(",")]
    except ValueError as exc:
        raise ValueError(f"--batch-at takes hours of the day: {exc}") from exc
    if len(starts) != len(JOBS) or not all(0 <= t < DAY_S for t in starts):
        raise ValueError(f"--batch-at takes {len(JOBS)} hours of the day in [0, 24)")
    if not 0 < args.batch_share < 1:
        raise ValueError("--batch-share must be within (0, 1)")
    return MixedScenario(
        traces_dir=args.traces_dir or default_traces_dir(),
        profile=load_profile(args.profile),
        hours=args.hours if args.hours is not None else 24.0,
        rate_scale=args.rate_scale if args.rate_scale is not None else 0.1,
        batch_share=args.batch_share,
        ttft_slo_s=args.ttft_slo,
        settings=Settings(_dt(args, 2.0), args.scrape_interval, args.scrape_delay, args.seed),
        jobs=tuple(
            (name, start, deadline) for (name, _, deadline), start in zip(JOBS, starts, strict=True)
        ),
    )


def _dt(args: argparse.Namespace, default: float) -> float:
    dt = float(args.dt) if args.dt is not None else default
    if dt <= 0 or 600 % dt:
        raise ValueError("--dt must be positive and divide 600 s")
    return dt


def read_spec(path: Path) -> LLMEndpointSpec:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a YAML mapping")
    return LLMEndpointSpec.model_validate(raw.get("spec", raw))


def run_simulate(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from kvscale.sim.plots import write_plots
    from kvscale.sim.report import summarise

    if args.mixed:
        return run_mixed(args)
    try:
        scenario = scenario_from(args)
        result = compare(scenario, jobs=args.jobs, progress=not args.quiet)
    except (TraceError, ProfileError, ValueError, ValidationError) as exc:
        print(f"kvscale simulate: {exc}", file=sys.stderr)
        return 2
    report = summarise(result)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "simulate.json"
    path.write_text(json.dumps({"traces": {scenario.trace: report}}, indent=2) + "\n")
    plots = [] if args.no_plots else write_plots(result, args.out_dir)
    print(table(report))
    print(f"wrote {path}" + "".join(f", {p}" for p in plots))
    return 0


def run_mixed(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        report = compare_mixed(mixed_scenario_from(args))
    except (TraceError, ProfileError, ValueError, ValidationError) as exc:
        print(f"kvscale simulate: {exc}", file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "simulate.json"
    path.write_text(json.dumps({"mixed": report}, indent=2) + "\n")
    print(mixed_table(report))
    print(f"wrote {path}")
    return 0


def mixed_table(report: dict[str, Any]) -> str:
    """One line per setup, then the issue's targets with the measured values."""
    work = report["workload"]
    share = work["batch_share_of_tokens"]
    lines = [
        f"mixed: {work['hours']} h, {work['interactive']}, batch {share:.0%} of tokens, "
        f"{report['replica_capacity_tokens_per_s']:.0f} tokens/s per replica"
    ]
    lines.append(f"{'setup':>16}  {'GPU-h':>8}  {'SLO min':>7}  {'met':>8}  {'missed':>6}  reasons")
    for name, r in report["setups"].items():
        reasons = " | ".join(
            ", ".join(f"{k} {v}" for k, v in sorted(pool.items())) for pool in r["reasons"]
        )
        lines.append(
            f"{name:>16}  {r['gpu_hours']:8.2f}  {r['interactive_slo_minutes_fraction']:7.4f}  "
            f"{r['deferred_met']:8d}  {r['deferred_missed']:6d}  {reasons}"
        )
    for name, t in report["targets"].items():
        lines.append(f"  {name}: {t['value']} ({t['target']}: {'met' if t['met'] else 'NOT met'})")
    return "\n".join(lines)


def table(report: dict[str, Any]) -> str:
    cols = (
        ("policy", None, "{}"),
        ("GPU-h", "gpu_hours", "{:.2f}"),
        ("x oracle", "gpu_hours_vs_oracle", "{:.2f}"),
        ("SLO min", "slo_minutes_fraction", "{:.3f}"),
        ("goodput", "goodput_fraction", "{:.3f}"),
        ("refused", "refused", "{}"),
        ("idle h", "idle_gpu_hours", "{:.2f}"),
        ("warm h", "warming_gpu_hours", "{:.2f}"),
        ("flaps", "flaps", "{}"),
        ("$/req", "cost_per_successful_request", "{:.5f}"),
        ("$/Mtok", "cost_per_million_tokens", "{:.3f}"),
    )
    rows = [[c[0] for c in cols]]
    for name, p in report["policies"].items():
        rows.append([name] + [_fmt(p.get(key), fmt) for _, key, fmt in cols[1:] if key])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    head = (
        f"{report['trace']}: {report['hours']} h, {report['requests']} requests "
        f"({report['mean_rate_rps']} req/s), profile {report['profile']}, "
        f"{report['replica_capacity']['oracle_tokens_per_s']:.0f} tokens/s per replica at the SLO"
    )
    lines += tuned_lines(report.get("tuning") or {})
    feasibility = report.get("slo_feasibility") or {}
    if feasibility and not feasibility["feasible"]:
        # no policy can meet this SLO: the table compares them against a target none can reach
        head = f"WARNING: {feasibility['message']}\n{head}"
    return "\n".join([head, *lines])


def tuned_lines(tuned: dict[str, Any]) -> list[str]:
    """After the table of defaults: each baseline's tuned pick against kvscale, judged part."""
    if not tuned:
        return []
    out = [
        f"tuned on the first {tuned['window_minutes']} minutes (cheapest setting with >= "
        f"{tuned['goal_slo_minutes_fraction']:.0%} SLO minutes there), judged on the rest:"
    ]
    rows = [("kvscale", "defaults", tuned.get("kvscale", {}).get("judged"))]
    rows.append(("oracle", "-", tuned.get("oracle", {}).get("judged")))
    for name, b in tuned["baselines"].items():
        pick = b["tuned"]
        value = "none met the goal" if pick is None else f"{b['tuned_value']:g}"
        rows.append((name, value, pick["judged"] if pick else None))
    for name, value, judged in rows:
        if judged is None:
            out.append(f"  {name:>12}  {value}")
            continue
        out.append(
            f"  {name:>12}  {value:>18}  {judged['gpu_hours']:8.2f} GPU-h  "
            f"{judged['slo_minutes_fraction']:.3f} SLO min"
        )
    return out


def _fmt(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
