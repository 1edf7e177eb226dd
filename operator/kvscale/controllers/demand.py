"""Demand in tokens: what an endpoint is asked for, from one snapshot and the one before it.

Served tokens understate demand while requests queue and overstate it while a backlog drains;
arrivals are what was served plus what joined the queue, and the queue still waiting is a backlog
to clear. Deferred work waiting in the engines is neither: released into spare capacity, it
waits behind interactive requests by design, and the capacity law counts it by its deadlines.
Pure functions, shared by the capacity law and its tests.
"""

from __future__ import annotations

import math

from kvscale.signals.snapshot import Snapshot

DEFAULT_REQUEST_TOKENS = 1000.0  # tokens per request until one has been measured


def request_tokens(snap: Snapshot, max_len: int) -> float:
    """Mean prompt + generated tokens of a request, from the window's rates (at most a context)."""
    if snap.successes_per_s > 0 and snap.tokens_per_s > 0:
        return min(snap.tokens_per_s / snap.successes_per_s, float(max_len))
    return min(DEFAULT_REQUEST_TOKENS, float(max_len))


def demand(
    snap: Snapshot,
    prev: Snapshot | None,
    interval_s: float,
    clear_s: float | None = None,
    max_len: int = 4096,
) -> float:
    """Tokens/s the endpoint is asked for.

    Arrivals are what was served plus what joined the queue (a queue that shrank was served
    from the backlog, so it counts against the served rate), plus what was refused; the backlog
    still queued is to be cleared within `clear_s` (default: one interval).
    """
    per_request = request_tokens(snap, max_len)
    queued = snap.interactive_waiting + snap.pending_requests
    growth = 0.0
    if prev is not None and prev.ok and snap.taken_at > prev.taken_at:
        before = prev.interactive_waiting + prev.pending_requests
        growth = (queued - before) / (snap.taken_at - prev.taken_at)
    arrivals = max(0.0, snap.tokens_per_s + growth * per_request)
    backlog = queued * per_request / (clear_s or interval_s)
    return arrivals + snap.refusals_per_s * per_request + backlog


def needed(tokens_per_s: float, capacity: float, headroom: float) -> int:
    return math.ceil(tokens_per_s * (1 + headroom) / capacity - 1e-9) if tokens_per_s > 0 else 0
