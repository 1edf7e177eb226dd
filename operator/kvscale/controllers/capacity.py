"""The capacity control law: how many replicas an endpoint needs now. A pure function.

`decide(history, spec, state, now)` reads one snapshot per capacity interval (oldest first; the
last is the current one), the endpoint's spec and the small state the previous call returned, and
returns the replica count with a reason code and a sentence. `CapacityLaw` is how it is called:
it takes one snapshot per interval, keeps the history the spec's windows need
(`history_length`) and the state, and returns the decision; the operator's capacity loop, the
simulator and the decide benchmark all hold one. The law:

- measures demand in tokens: prompt + generated tokens/s, plus the queued backlog (waiting,
  refused and router-held requests, at the mean tokens of a request) to be cleared in one interval;
- forecasts that demand over the horizon a new replica needs to help (its measured start-up time
  plus one interval) and sizes for the larger of forecast and now: ceil(demand·(1+headroom)/c),
  where c is the per-replica capacity learned online: the throughput replicas carried within the
  SLO, and the throughput at which it broke (the median replica's, or that of the replicas with
  work queued at them where higher) (`replica_capacity`; a probe between the two at most
  `probe_reach` times the former), raised to what the engines' latency says one replica carries
  within the SLO (`latency_model`) once that fit is sure, at most `MODEL_MULTIPLE` times the
  throughput seen within the SLO, and not at all while a throughput at which the SLO broke lies
  below that; the decision's sentence names the source;
- goes up at once when the endpoint is in trouble (queue growing, p99 TTFT above
  `TTFT_EVIDENCE` of the SLO while requests wait and replicas carry at least the load the law
  sizes them for, 1/(1 + headroom) of their capacity; KV cache above 0.9, preemptions rising): a
  panic step of up to double the ready replicas per interval, counting replicas already starting;
  no step beyond what demand needs while a replica is starting or turned Ready in the last
  interval (the backlog read then was built before it served; demand counts that backlog);
  deferred work waiting in or preempted by the engines (by design) is no trouble;
- goes down slowly: only after fewer replicas would have done for `scaleDownStabilizationSeconds`,
  then one replica per interval, and only while N-1 replicas would carry the window's peak demand
  and the forecast with the headroom and a further margin (the consolidation check that prevents
  2<->1 oscillation);
- scales to zero after `scaleToZeroAfterSeconds` of idleness when `minReplicas` is 0, and from
  zero as soon as requests are held for it (the router's pending demand);
- counts deferrable classes' work at the rate their deadlines require (`deferred`), not as demand
  now (released work waiting in the engines is to be cleared within one interval): the
  replicas' token rates less what they served of deferred work is the interactive demand that
  is forecast and sized with the headroom; the deferred rate is added on top (with the same
  headroom: the routers fill only what it leaves), so spare capacity carries it first and a
  replica is added for it only when deadlines require one, and a scale-in waits while N-1
  replicas could not carry both;
- never adds more than one replica beyond those the scheduler could place;
- holds its last decision when signals are missing, stale or unreachable: it never scales down
  blind.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvscale.api.v1alpha1 import LLMEndpointSpec
from kvscale.controllers.deferred import required_tokens_per_s
from kvscale.controllers.demand import demand, needed, request_tokens
from kvscale.controllers.forecast import Forecaster
from kvscale.controllers.latency_model import LatencyModel
from kvscale.controllers.replica_capacity import Observation, ReplicaCapacity
from kvscale.signals.snapshot import ReplicaSignals, Snapshot

DEFAULT_STARTUP_S = 120.0  # until a start-up has been measured
KV_FULL = 0.9
SCALE_DOWN_MARGIN = 0.05  # N-1 replicas must carry the peak with at least this much to spare
MAX_MARGIN = 0.5  # ... and with the forecast's recent relative error, up to this much
STARTUP_WEIGHT = 0.3  # EWMA weight of a newly measured start-up time
MIN_EVIDENCE_TOKENS_PER_S = 1.0  # less than this per replica teaches nothing about capacity
# a read p99 TTFT above this share of the SLO while requests wait counts as the SLO broken: the
# operator reads p99 from vLLM's TTFT buckets (... 2.5, 5, 7.5, 10, 20 s), and interpolation inside
# a bucket plus a window that straddles minutes put it up to a bucket below the truth where
# prompts take seconds to prefill (Mooncake at a 10 s SLO: 7.9-9.3 s read in minutes whose p99
# was above 10 s, with requests waiting)
TTFT_EVIDENCE = 0.75
# ... but only while the replicas carry at least the load the law sizes them for, 1/(1 + headroom)
# of their capacity: below it, such a tail is the workload's (long prompts prefilling on replicas
# with room to spare), which more replicas do not shorten. On Mooncake at a 10 s SLO reads of
# 7.7-8 s at 45-65% of the capacity added 20-30 replicas each (1.9x the oracle's GPU-hours at 100%
# SLO minutes); a fixed 0.75, below the law's own operating point (0.83 at 20% headroom), made the
# reads at 72-77% into breaks: each cut the capacity to ~9.8k tokens/s, the fleet grew from 46 to
# 58 replicas and came back as the bound was forgotten (1.51x the oracle, every SLO minute met)
HISTORY_FLOOR_S = 600.0  # the history covers at least this much, whatever the stabilization
# the latency model may size a replica for at most this multiple of the throughput one carried
# within the SLO: beyond its data a line is optimistic (tail latency turns up sharply near a full
# batch), so the estimate climbs with the load it has seen, by at most this factor ahead of it
MODEL_MULTIPLE = 2.0


def probe_reach(headroom: float) -> float:
    """How far above the throughput a replica carried within the SLO the estimate learned from
    throughput may go: (1 + headroom)^2, so that replicas sized with it (at 1/(1 + headroom) of
    it) carry at most one headroom more than they have been seen to carry within the SLO."""
    return (1.0 + headroom) ** 2


@dataclass(frozen=True)
class CapacityState:
    """What the law remembers between calls; frozen and serialisable (kept in status)."""

    desired: int | None = None
    changed_at: float | None = None
    low_since: float | None = None  # since when N-1 replicas would do
    idle_since: float | None = None  # since when no tokens, requests or held requests
    startup_s: float | None = None
    forecaster: Forecaster = field(default_factory=Forecaster)
    capacity: ReplicaCapacity = field(default_factory=ReplicaCapacity)
    model: LatencyModel = field(default_factory=LatencyModel)

    def replica_capacity(self, spec: LLMEndpointSpec) -> tuple[float, str]:
        """What one replica carries within the SLO (tokens/s), and where the figure came from."""
        prior = spec.scaling.replica_capacity_tokens_per_second
        seen = self.capacity.value(prior, probe_reach(spec.scaling.headroom))
        bounds = self.capacity
        if bounds.low is None and bounds.high is None:
            source = "the spec's prior" if prior is not None else "the default prior"
        else:
            source = "learned from throughput"
        slo = spec.slo
        solved = self.model.capacity(TTFT_EVIDENCE * slo.ttft_p99_seconds, slo.itl_p99_seconds)
        if solved is None or bounds.low is None:
            return seen, source
        # the model sizes within MODEL_MULTIPLE of what held, and only where that whole range lies
        # below any throughput at which the SLO broke: a break closer than that says more than a
        # line (an engine whose latency turns up at once shows nothing before it), until it is
        # forgotten
        bound = MODEL_MULTIPLE * bounds.low
        if bounds.high is not None and bounds.high < bound:
            return seen, source
        value = min(solved, bound)
        if value <= seen:
            return seen, source
        return value, "solved from the latency model"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> CapacityState:
        """Rebuilds a state from `to_dict()`; anything unreadable starts afresh."""
        try:
            data = dict(raw or {})
            data["forecaster"] = Forecaster(**(data.get("forecaster") or {}))
            data["capacity"] = ReplicaCapacity(**(data.get("capacity") or {}))
            data["model"] = LatencyModel.from_dict(data.get("model"))
            return cls(**data)
        except TypeError:
            return cls()


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    message: str
    state: CapacityState
    demand_tokens_per_s: float = 0.0
    forecast_tokens_per_s: float = 0.0
    per_replica_tokens_per_s: float = 0.0
    victim: str | None = None
    deferred_tokens_per_s: float = 0.0  # the rate the deferred backlog's deadlines require
    capacity_source: str = ""  # where per_replica_tokens_per_s came from


@dataclass(frozen=True)
class _Tick:
    """What one call derives before choosing (internal)."""

    now: float
    current: int
    ready: int
    demand: float
    peak: float
    forecast: float
    capacity: float
    capacity_source: str
    horizon: float
    deferred: float  # tokens/s the deferred backlog's deadlines require


def history_length(spec: LLMEndpointSpec) -> int:
    """Snapshots the law keeps: its scale-down window (at least ten minutes) and two more."""
    scaling = spec.scaling
    span = max(float(scaling.scale_down_stabilization_seconds), HISTORY_FLOOR_S)
    return math.ceil(span / scaling.capacity_interval_seconds) + 2


@dataclass
class CapacityLaw:
    """The law with what it remembers: one snapshot in per capacity interval, a decision out.

    The history is sized from the spec at each call (the spec may change), so every caller's
    scale-down window is the spec's, not a caller's choice.
    """

    state: CapacityState = field(default_factory=CapacityState)
    history: list[Snapshot] = field(default_factory=list)

    def record(self, snap: Snapshot, spec: LLMEndpointSpec) -> None:
        """Keeps a snapshot without deciding (while the spec pins the replicas)."""
        self.history = [*self.history, snap][-history_length(spec) :]

    def decide(self, snap: Snapshot, spec: LLMEndpointSpec, now: float) -> Decision:
        self.record(snap, spec)
        decision = decide(self.history, spec, self.state, now)
        self.state = decision.state
        return decision


def decide(
    history: Sequence[Snapshot], spec: LLMEndpointSpec, state: CapacityState, now: float
) -> Decision:
    """The replica count for the endpoint now; see the module docstring for the law."""
    snap = history[-1]
    scaling = spec.scaling
    current = snap.fleet.current
    held = state.desired if state.desired is not None else current
    interval = float(scaling.capacity_interval_seconds)
    if not snap.ok or now - snap.taken_at > 3 * interval:
        why = snap.message or f"the newest signals are {now - snap.taken_at:.0f} s old"
        return _hold(held, spec, state, f"Signals unusable ({why}): holding {held} replicas")
    state = _observe(snap, _previous(history), spec, state, now)
    tick = _tick(history, spec, state, now)
    want, reason, message = _choose(history, spec, state, tick)
    # what this interval teaches about a replica's capacity sizes the next decisions, not this
    # one: sizing stays monotone in demand
    learned = replace(
        state,
        capacity=_learn_capacity(snap, spec, state.capacity, tick.capacity),
        model=_learn_model(snap, state.model),
    )
    return _finish(want, reason, message, history, spec, learned, tick)


def _hold(held: int, spec: LLMEndpointSpec, state: CapacityState, message: str) -> Decision:
    scaling = spec.scaling
    desired = min(max(held, scaling.min_replicas), scaling.max_replicas)
    est, source = state.replica_capacity(spec)
    return Decision(
        desired,
        "MetricsUnavailable",
        message,
        replace(state, desired=desired),
        forecast_tokens_per_s=state.forecaster.level or 0.0,
        per_replica_tokens_per_s=est,
        capacity_source=source,
    )


def _observe(
    snap: Snapshot, prev: Snapshot | None, spec: LLMEndpointSpec, state: CapacityState, now: float
) -> CapacityState:
    """The forecaster and start-up time updated with this interval's demand and pods."""
    interval = float(spec.scaling.capacity_interval_seconds)
    startup = state.startup_s
    if snap.fleet.startup_seconds is not None:
        measured = snap.fleet.startup_seconds
        startup = measured if startup is None else startup + STARTUP_WEIGHT * (measured - startup)
    state = replace(state, startup_s=startup)
    observed = _interactive(
        snap, prev, interval, _reaction_s(spec, state), spec.model.max_model_len
    )
    return replace(state, forecaster=state.forecaster.observe(observed, now))


def _interactive(
    snap: Snapshot, prev: Snapshot | None, interval_s: float, clear_s: float, max_len: int
) -> float:
    """Demand now: what the replicas served and were asked for, less the deferred work they
    served (released from the routers' queues into spare capacity, it is not demand now)."""
    asked = demand(snap, prev, interval_s, clear_s, max_len)
    return max(0.0, asked - snap.deferred_served_tokens_per_s)


def _reaction_s(spec: LLMEndpointSpec, state: CapacityState) -> float:
    """How long a replica added now takes to help: its start-up time plus one interval.

    A queued backlog is cleared over this time, by replicas that are or will be starting.
    """
    startup = state.startup_s if state.startup_s is not None else DEFAULT_STARTUP_S
    return startup + spec.scaling.capacity_interval_seconds


def _learn_capacity(
    snap: Snapshot, spec: LLMEndpointSpec, capacity: ReplicaCapacity, figure: float
) -> ReplicaCapacity:
    """What this interval says of a replica's capacity, `figure` being what the law sized with."""
    ready = snap.fleet.ready
    if ready == 0:
        return capacity
    snap = _settled(snap)
    carried = _carried(snap)
    if carried < MIN_EVIDENCE_TOKENS_PER_S:
        return capacity  # a replica that served (almost) nothing says nothing about its capacity
    slo = spec.slo
    ttft, itl = snap.latency.ttft_p99, snap.latency.itl_p99
    within = None
    if ttft is not None or itl is not None:
        broken = _ttft_broken(ttft, slo.ttft_p99_seconds, carried / figure, spec.scaling.headroom)
        within = not broken and (itl is None or itl <= slo.itl_p99_seconds)
    if within is False and snap.replicas:
        # a break bounds the capacity at no less than what the replicas that had more work than
        # they could start carried: while one replica works off a backlog, those that turned
        # Ready beside it carry little with nothing queued, and the median of all says nothing
        # about what a replica carries (a vLLM run's bound fell to 89 tokens/s that way, against
        # 2,030 learned before, and held two replicas through a quiet spell). Not below the
        # median either: where long prompts queue at some replicas (Mooncake), those carried
        # less in the window than the median, and bounding by them cost 1.39x the oracle's
        # GPU-hours against 1.18x
        full = [r.tokens_per_s for r in snap.replicas if _saturated(r)]
        bound = max(carried, statistics.median(full)) if full else carried
        return capacity.learn(Observation(bound, False, bool(full)))
    saturated = snap.waiting > 0 or snap.preemptions_per_s > 0 or snap.kv_usage_max > KV_FULL
    seen = Observation(carried, within, saturated or snap.refusals_per_s > 0)
    return capacity.learn(seen)


def _saturated(replica: ReplicaSignals) -> bool:
    """The replica had more work than it could start: requests queued or refused, preemptions,
    or its KV cache nearly full."""
    return (
        replica.waiting > 0
        or replica.refusals_per_s > 0
        or replica.preemptions_per_s > 0
        or replica.kv_usage > KV_FULL
    )


def _settled(snap: Snapshot) -> Snapshot:
    """The snapshot's replicas that were Ready through its whole window, where there are any:
    one that turned Ready inside it served part of the window, and its rate over the window (or
    over its process's life) understates what it carries. Beside one replica with a backlog, a
    second Ready for the last seconds of the window halves the median of the two, and a break
    read then would bound the capacity at that half (as fresh vLLM replicas beside a backlogged
    one once bounded it at 89 tokens/s, docs/keda.md)."""
    start = snap.taken_at - snap.window_s
    settled = tuple(r for r in snap.replicas if r.ready_since is None or r.ready_since <= start)
    if not settled or len(settled) == len(snap.replicas):
        return snap
    return replace(snap, replicas=settled)


def _carried(snap: Snapshot) -> float:
    """What one replica carried: the median of those read, not the total over `ready` (a replica
    that turned Ready after the window began served little of it and would drag the figure
    down; the one busiest by chance would lift it)."""
    if snap.replicas:
        return statistics.median(r.tokens_per_s for r in snap.replicas)
    return snap.tokens_per_s / snap.fleet.ready if snap.fleet.ready else 0.0


def _ttft_broken(ttft: float | None, slo_s: float, load_share: float, headroom: float) -> bool:
    """A read p99 TTFT says the SLO broke: above it, or above `TTFT_EVIDENCE` of it (the bucket
    below, where the read understates the truth) while replicas carry at least the share of their
    capacity the law sizes them for (`load_share` is what they carry over that capacity)."""
    if ttft is None:
        return False
    sized = 1.0 / (1.0 + headroom)
    return ttft > slo_s or (ttft > TTFT_EVIDENCE * slo_s and load_share >= sized - 1e-9)


def _learn_model(snap: Snapshot, model: LatencyModel) -> LatencyModel:
    """Each replica that served this interval: its tokens/s against its p99 TTFT and ITL."""
    served = [r for r in snap.replicas if r.tokens_per_s >= MIN_EVIDENCE_TOKENS_PER_S]
    ttft = [(r.tokens_per_s, r.latency.ttft_p99) for r in served if r.latency.ttft_p99]
    itl = [(r.tokens_per_s, r.latency.itl_p99) for r in served if r.latency.itl_p99]
    return model.learn(ttft, itl)


def _tick(
    history: Sequence[Snapshot], spec: LLMEndpointSpec, state: CapacityState, now: float
) -> _Tick:
    scaling = spec.scaling
    interval = float(scaling.capacity_interval_seconds)
    snap = history[-1]
    reaction = _reaction_s(spec, state)
    horizon = min(reaction, float(scaling.forecast_horizon_seconds))
    recent = [
        _interactive(s, p, interval, reaction, spec.model.max_model_len)
        for p, s in zip([None, *history[:-1]], history, strict=True)
        if s.ok and now - s.taken_at <= scaling.scale_down_stabilization_seconds
    ]
    now_demand = _interactive(
        snap, _previous(history), interval, reaction, spec.model.max_model_len
    )
    peak = max([*recent, now_demand])
    capacity, source = state.replica_capacity(spec)
    return _Tick(
        now=now,
        current=snap.fleet.current,
        ready=snap.fleet.ready,
        demand=now_demand,
        peak=peak,
        forecast=state.forecaster.predict(now + horizon) if horizon else now_demand,
        capacity=capacity,
        capacity_source=source,
        horizon=horizon,
        deferred=_deferred_rate(snap, interval, spec.model.max_model_len),
    )


def _deferred_rate(snap: Snapshot, clear_s: float, max_len: int) -> float:
    """The rate deferred work needs: the routers' backlog at the rate its deadlines require,
    plus the released work that waits in the engines (forced out near its deadline, or released
    into room interactive work took back): its deadlines are not known here, and the routers
    release work late only when it must start, so it is to be cleared within one interval."""
    held = sum(b.requests for b in snap.deferred)
    # a held request's tokens (prompt + max_tokens) say what the released ones cost, better than
    # the mean over every request (batch prompts are often longer than chat's)
    per = snap.deferred_tokens / held if held > 0 else request_tokens(snap, max_len)
    released = snap.deferred_waiting * per / clear_s
    return required_tokens_per_s(snap.deferred) + released


def _panic(history: Sequence[Snapshot], spec: LLMEndpointSpec, tick: _Tick) -> str | None:
    """Why the endpoint is in trouble right now, if it is.

    Deferred work never is: released into spare capacity, it waits in the engines behind
    interactive requests and is preempted by them by design, so the queue and preemption checks
    read interactive requests only, and a high p99 TTFT counts only while interactive requests
    wait (or are refused). Only the deadline arithmetic adds replicas for deferred work.
    """
    snap = history[-1]
    prev = history[-2] if len(history) > 1 and history[-2].ok else None
    queued = _queued(snap)
    # a request caught between arrival and its first step is noise: a queue counts when every
    # ready replica has one waiting, and it grew since the last interval
    deep = queued >= max(1, tick.ready)
    if prev is not None and deep and queued > _queued(prev):
        return "QueueGrowing"
    broken = _ttft_broken(
        snap.latency.ttft_p99,
        spec.slo.ttft_p99_seconds,
        _carried(snap) / tick.capacity,
        spec.scaling.headroom,
    )
    if broken and (queued > 0 or snap.refusals_per_s):
        return "TTFTAboveSLO"
    if snap.kv_usage_max > KV_FULL:
        return "KVCacheFull"
    rising = snap.interactive_preemptions_per_s
    if prev is not None and rising > max(prev.interactive_preemptions_per_s, 0.0):
        return "PreemptionsRising"
    return None


def _queued(snap: Snapshot) -> float:
    """Interactive requests waiting in the engines or held at the routers (from zero)."""
    return snap.interactive_waiting + snap.pending_requests


def _choose(
    history: Sequence[Snapshot], spec: LLMEndpointSpec, state: CapacityState, tick: _Tick
) -> tuple[int, str, str]:
    scaling = spec.scaling
    snap = history[-1]
    load = max(tick.demand, tick.forecast)
    interactive = needed(load, tick.capacity, scaling.headroom)
    want = _with_deferred(load, tick, scaling.headroom)
    sizing = (
        f"demand {tick.demand:.0f} tokens/s, forecast {tick.forecast:.0f} over "
        f"{tick.horizon:.0f} s, {tick.capacity:.0f} tokens/s per replica "
        f"({tick.capacity_source})"
    )
    if tick.deferred > 0:
        sizing += f", deferred work due at {tick.deferred:.0f} tokens/s"
    if tick.current == 0:
        if snap.pending_requests > 0 or tick.demand > 0 or snap.deferred_tokens > 0:
            # what waits now, not a trend extrapolated from an empty endpoint
            first = max(1, _with_deferred(tick.demand, tick, scaling.headroom))
            return first, "ScaleFromZero", f"Requests are waiting for a replica ({sizing})"
        return 0, "ScaledToZero", "No demand and no replicas"
    panic = _panic(history, spec, tick)
    if panic is not None:
        # at least one more replica unless some are still starting or one turned Ready since
        # the last interval (the backlog read now was built before it served); demand, the
        # backlog included, sizes the rest
        prev = _previous(history)
        joined = prev is not None and tick.ready > prev.fleet.ready
        starting = tick.current > tick.ready or joined
        target = max(want, tick.current if starting else tick.current + 1)
        if target > tick.current:
            return target, panic, f"{_PANIC_TEXT[panic]}: adding replicas at once ({sizing})"
    if want > tick.current:
        if interactive <= tick.current:
            return want, "DeadlinesRequire", f"Deferred work would miss its deadlines ({sizing})"
        return want, "DemandForecast", f"Scaling up for {sizing}"
    return _maybe_down(spec, state, tick, want, sizing)


def _with_deferred(load: float, tick: _Tick, headroom: float) -> int:
    """Replicas for interactive `load` and the deferred rate, both with the headroom: spare
    capacity carries the deferred work before it asks for a replica of its own, and the routers
    fill a replica's spare room only up to what the headroom leaves of it, so the deadlines'
    rate needs the same margin to be served at that rate."""
    if tick.deferred <= 0:
        return needed(load, tick.capacity, headroom)
    return math.ceil((load + tick.deferred) * (1 + headroom) / tick.capacity - 1e-9)


_PANIC_TEXT = {
    "QueueGrowing": "Requests are queueing faster than they are served",
    "TTFTAboveSLO": "p99 time to first token is at or above the SLO while requests wait",
    "KVCacheFull": "A replica's KV cache is more than 90% full",
    "PreemptionsRising": "Preemptions are rising",
}


def _maybe_down(
    spec: LLMEndpointSpec, state: CapacityState, tick: _Tick, want: int, sizing: str
) -> tuple[int, str, str]:
    scaling = spec.scaling
    idle_for = tick.now - state.idle_since if state.idle_since is not None else 0.0
    idle_limit = scaling.scale_to_zero_after_seconds
    zero_ok = scaling.min_replicas == 0 and idle_limit is not None and tick.demand == 0
    if zero_ok and idle_for >= (idle_limit or 0):
        return 0, "ScaleToZero", f"Idle for {idle_for:.0f} s: removing the last replicas"
    n = tick.current
    floor = max(scaling.min_replicas, 1)
    if n <= floor:
        return n, "Stable", f"At {n} replicas ({sizing})"
    # the less the forecast can be trusted (bursty traffic), the more N-1 must have to spare
    margin = min(max(SCALE_DOWN_MARGIN, state.forecaster.error or 0.0), MAX_MARGIN)
    room = (n - 1) * tick.capacity * (1 - margin)
    interactive = max(tick.peak, tick.forecast) * (1 + scaling.headroom)
    if interactive + tick.deferred * (1 + scaling.headroom) > room:
        if interactive <= room:
            return n, "DeadlinesHold", f"{n - 1} replicas would miss deferred deadlines ({sizing})"
        return n, "Stable", f"{n} replicas needed ({sizing})"
    low_for = tick.now - state.low_since if state.low_since is not None else 0.0
    if low_for < scaling.scale_down_stabilization_seconds:
        return (
            n,
            "StabilizingDown",
            (
                f"{n - 1} replicas would carry the load; waiting "
                f"{scaling.scale_down_stabilization_seconds - low_for:.0f} s more ({sizing})"
            ),
        )
    return (
        n - 1,
        "Consolidating",
        (
            f"{n - 1} replicas carry the peak of the last "
            f"{scaling.scale_down_stabilization_seconds} s with headroom ({sizing})"
        ),
    )


def _finish(
    want: int,
    reason: str,
    message: str,
    history: Sequence[Snapshot],
    spec: LLMEndpointSpec,
    state: CapacityState,
    tick: _Tick,
) -> Decision:
    scaling = spec.scaling
    snap = history[-1]
    fleet = snap.fleet
    desired = min(max(want, scaling.min_replicas), scaling.max_replicas)
    if desired != want:
        message = f"{message}; bounded to {desired} by the spec"
        if reason in ("DemandForecast", "Stable", "StabilizingDown", "Consolidating"):
            reason = "AtMaxReplicas" if want > desired else "AtMinReplicas"
    placed = fleet.current - fleet.unschedulable
    if fleet.unschedulable and desired > placed + 1:
        desired = min(max(placed + 1, scaling.min_replicas), scaling.max_replicas)
        reason = "CapacityLimited"
        message = (
            f"{fleet.unschedulable} replica(s) cannot be scheduled ({fleet.unschedulable_reason}); "
            f"holding at {desired}, one beyond what runs"
        )
    idle = (
        tick.demand == 0
        and snap.running == 0
        and snap.pending_requests == 0
        and snap.deferred_tokens == 0
    )
    new_state = replace(
        state,
        desired=desired,
        changed_at=tick.now if desired != state.desired else state.changed_at,
        idle_since=_since(state.idle_since, tick.now) if idle else None,
        # fewer replicas have done since low_since: after a full window, one step per interval
        # while they still do
        low_since=_since(state.low_since, tick.now)
        if reason in ("StabilizingDown", "Consolidating")
        else None,
    )
    # not-ready pods go first when a ReplicaSet shrinks; a ready one must be drained beforehand
    victim = _victim(snap) if desired < fleet.ready and desired < tick.current else None
    return Decision(
        desired,
        reason,
        message,
        new_state,
        demand_tokens_per_s=tick.demand,
        forecast_tokens_per_s=tick.forecast,
        per_replica_tokens_per_s=tick.capacity,
        victim=victim,
        deferred_tokens_per_s=tick.deferred,
        capacity_source=tick.capacity_source,
    )


def _previous(history: Sequence[Snapshot]) -> Snapshot | None:
    return history[-2] if len(history) > 1 else None


def _since(start: float | None, now: float) -> float:
    return now if start is None else start


def _victim(snap: Snapshot) -> str | None:
    """The replica to drain first: the least loaded, the newest among equals."""
    if not snap.replicas:
        return None
    chosen = min(
        snap.replicas, key=lambda r: (r.running + r.waiting, -(r.created_at or 0.0), r.pod)
    )
    return chosen.pod
