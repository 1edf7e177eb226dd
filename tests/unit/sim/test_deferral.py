"""The simulated deferred queue and deferrable requests in the engine and the recorder."""

from __future__ import annotations

import math

import numpy as np
from sim_helpers import batch, limits, profile

from kvscale.sim.deferral import FINISH_MARGIN_S, DeferralQueue
from kvscale.sim.endpoint import Endpoint
from kvscale.sim.engine import Deferred, Engines
from kvscale.sim.mixed import Job
from kvscale.sim.recorder import Recorder, Targets


def endpoint(replicas: int = 1) -> Endpoint:
    ep = Endpoint("e", profile(), limits(), 8, np.random.default_rng(0))
    ep.scale_to(replicas, 0.0, instant=True)
    return ep


def queue_of(n: int, deadline_s: float, capacity: float = 10_000.0) -> DeferralQueue:
    q = DeferralQueue(capacity)
    q.hold(batch(n, 0.0, inp=900, out=100), np.full(n, deadline_s))
    return q


def test_the_backlog_is_exported_as_cumulative_due_buckets() -> None:
    q = queue_of(3, 3600.0)
    q.hold(batch(2, 0.0, inp=400, out=100), np.full(2, 250.0))
    b = q.backlog(10.0, 0.0, 0.0)
    assert b.requests == 5 and b.oldest_age_s == 10.0
    due = dict(b.due)
    assert due[60.0] == 0 and due[300.0] == 1000  # the two due at 250 s, 240 s from now
    assert due[1800.0] == 1000 and due[3600.0] == 4000 and due[math.inf] == 4000


def test_spare_capacity_is_filled_earliest_deadline_first_at_the_lowest_priority() -> None:
    ep, q = endpoint(), queue_of(10, 3600.0)
    q.hold(batch(1, 0.0, inp=900, out=100), np.full(1, 600.0))
    q.saw_interactive(2000.0, 1.0)  # far below one replica's 10k tokens/s
    q.release(ep, 1.0, 1.0)
    e = ep.engines
    released = len(e.rep)
    assert 0 < released < 11 and len(q) == 11 - released
    assert e.low.all() and e.valley.all()
    assert e.deadline.min() == 600.0  # the earliest deadline went first


def test_without_spare_capacity_work_waits_until_it_must_start() -> None:
    ep, q = endpoint(), queue_of(4, 3600.0)
    q.saw_interactive(1e9, 1.0)  # interactive takes everything
    q.release(ep, 10.0, 1.0)
    assert len(q) == 4 and len(ep.engines.rep) == 0
    q.release(ep, 3601.0 - FINISH_MARGIN_S, 1.0)  # the deadlines force them out
    assert len(q) == 0 and not ep.engines.valley.any()
    late = queue_of(2, 100.0)
    late.saw_interactive(1e9, 1.0)
    late.release(endpoint(0), 150.0, 1.0)  # nowhere to go, and now too late
    assert late.missed == 2 and len(late) == 0


def test_interactive_requests_are_admitted_before_deferred_ones() -> None:
    e = Engines(profile(), limits(seqs=1), 1)
    deferred = batch(1, 0.0)
    e.add(deferred, np.zeros(1, dtype=np.int64), Deferred(
        np.full(1, 3600.0), np.full(1, 3600.0), np.ones(1, dtype=bool), np.ones(1, dtype=bool)
    ))  # fmt: skip
    e.add(batch(1, 0.5), np.zeros(1, dtype=np.int64))
    out = e.step(1.0, 1.0)
    assert len(out.first_at) == 1 and not out.first_deferred.any()
    assert out.first_at[0] == 0.5  # the interactive one, though it arrived later


def test_the_recorder_judges_deferred_requests_by_their_deadline_not_the_slo() -> None:
    ep = endpoint()
    e = ep.engines
    b = batch(2, 0.0, inp=500, out=5)
    deadlines = np.array([1.0, 3600.0])  # the first cannot make it
    e.add(b, np.zeros(2, dtype=np.int64), Deferred(
        deadlines, np.full(2, 3600.0), np.ones(2, dtype=bool), np.array([True, False])
    ))  # fmt: skip
    rec = Recorder(600.0, Targets(0.001, 0.2), 1)
    for k in range(10):
        rec.add(float(k), 1.0, batch(0, float(k)), e.step(float(k), 1.0), ep)
    s = rec.series
    assert s["deferred_met"].sum() == 1 and s["deferred_missed"].sum() == 1
    assert s["deferred_tokens"].sum() == 1010 and s["valley_tokens"].sum() == 505
    assert rec.ttft.sum() == 0 and s["good"].sum() == 0  # no TTFT judged against the SLO


def test_a_daily_job_replays_its_trace_from_its_start_each_day() -> None:
    class Trace:
        duration_s = 120.0

        def window(self, t0: float, t1: float) -> object:
            return batch(1, t0)

    job = Job("batch", 3600.0, 600.0, Trace())  # type: ignore[arg-type]
    assert len(job.window(0.0, 1.0)) == 0
    assert job.window(3610.0, 3611.0).at[0] == 3610.0
    assert job.window(86_400.0 + 3610.0, 86_400.0 + 3611.0).at[0] == 86_400.0 + 3610.0
    assert len(job.window(3600.0 + 130.0, 3600.0 + 131.0)) == 0
