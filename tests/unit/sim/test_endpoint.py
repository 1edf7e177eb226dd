"""Replica lifecycle and routing: start-up delay, drain before removal, least-loaded spreading."""

from __future__ import annotations

import numpy as np
from sim_helpers import batch, limits, profile

from kvscale.sim.endpoint import Endpoint


def endpoint(startup_s: float = 30.0) -> Endpoint:
    return Endpoint("e", profile(startup_s=startup_s), limits(), 8, np.random.default_rng(0))


def test_new_replicas_become_ready_after_the_startup_time() -> None:
    ep = endpoint(30.0)
    ep.scale_to(2, 0.0)
    assert ep.fleet(10.0).ready == 0 and ep.fleet(10.0).starting == 2
    ep.became_ready(29.0, 31.0)
    assert ep.fleet(31.0).ready == 2
    assert ep.fleet(31.0).startup_seconds == 30.0


def test_requests_are_held_while_no_replica_is_ready_then_placed() -> None:
    ep = endpoint(30.0)
    ep.scale_to(1, 0.0)
    ep.route(batch(5, 0.0), 0.0)
    assert ep.engines.held() == 5
    ep.route(batch(0, 31.0), 31.0)
    assert ep.engines.held() == 0


def test_scale_in_drains_the_victim_and_removes_it_only_when_empty() -> None:
    ep = endpoint(0.0)
    ep.scale_to(2, 0.0, instant=True)
    ep.route(batch(20, 0.0, out=200), 0.0)
    victim = next(iter(ep.replicas.values()))
    ep.scale_to(1, 1.0, victim=victim.pod)
    assert victim.draining
    ep.route(batch(10, 1.0), 1.0)
    assert ep.engines.in_slot(victim.slot) <= 10  # none of the new requests went to it
    t = 1.0
    while victim.slot in ep.replicas and t < 600:
        ep.engines.step(t, 1.0)
        t += 1.0
        ep.settle(t)
    assert victim.slot not in ep.replicas
    assert len(ep.replicas) == 1


def test_scale_up_during_a_drain_takes_the_drain_back() -> None:
    ep = endpoint(0.0)
    ep.scale_to(2, 0.0, instant=True)
    ep.route(batch(20, 0.0, out=200), 0.0)
    ep.scale_to(1, 1.0)
    ep.scale_to(2, 2.0)
    assert len(ep.replicas) == 2 and not any(r.draining for r in ep.replicas.values())


def test_scale_in_drops_replicas_that_are_still_starting_first() -> None:
    ep = endpoint(30.0)
    ep.scale_to(1, 0.0, instant=True)
    ep.scale_to(3, 1.0)
    ep.scale_to(1, 2.0)
    assert len(ep.replicas) == 1 and ep.fleet(2.0).ready == 1


def test_arrivals_spread_evenly_over_idle_replicas() -> None:
    ep = endpoint(0.0)
    ep.scale_to(4, 0.0, instant=True)
    ep.route(batch(40, 0.0), 0.0)
    counts = [ep.engines.in_slot(r.slot) for r in ep.replicas.values()]
    assert counts == [10, 10, 10, 10]
