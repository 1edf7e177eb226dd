"""Every replica's engine, one time step at a time: queues, continuous batching, KV limits.

Requests are rows of a struct of arrays (all replicas together), so one step costs a fixed number
of numpy calls whatever the replica count. Within a step of `dt` seconds each replica runs the
scheduler vLLM and the kvscale engine share: first-come first-served admission while a slot
(`maxNumSeqs`) and KV room for the prompt are free; chunked prefill with the step's token budget
(`maxNumBatchedTokens` minus one token per decoding sequence) shared in arrival order; every
decoding sequence gets one token per step; a replica whose KV overflows preempts its newest
sequences (recompute). It is a fluid model of those steps: the batch size and mean context are
fixed for the `dt` (taken at its start), steps are fractional, and a step's time comes from the
profile (decode step by batch and context, plus the prefill chunk at the profile's rate). What it
does not model: per-request prefix-cache misses (Mooncake's hits are taken as ideal), sampling
cost per request, and the order of tokens inside a step.

Deferrable requests (mixed workloads, sim/deferral.py) carry a deadline and may run at the lowest
priority: waiting low-priority requests are admitted and prefilled after every interactive one of
their replica, and being the newest they are the first preempted when the KV cache overflows.
Each request has its own queue-wait limit (a deferrable class's is its deadline). The replicas'
signals split as the kvscale engine's do: the time-to-first-token histogram holds interactive
requests only, and the waiting requests and preemptions of deferred work are counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kvscale.sim.arrivals import Batch
from kvscale.sim.profile import EngineProfile

F = NDArray[np.float64]
IntA = NDArray[np.int64]
B = NDArray[np.bool_]

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), as the engine exports them
TTFT_BUCKETS = np.array([
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
])  # fmt: skip
ITL_BUCKETS = np.array([
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
])  # fmt: skip
COUNTERS = ("prompt_tokens", "generation_tokens", "successes", "refusals", "preemptions")
# deferred requests' prompt + generated tokens, and of those the ones released into spare capacity;
# preemptions of deferred work (the engine's kvscale_engine_preemptions{deferrable="true"})
DEFERRED_COUNTERS = ("deferred_tokens", "valley_tokens", "deferred_preemptions")


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int
    max_model_len: int
    max_queue_wait_s: float


@dataclass
class StepOutcome:
    """What happened in one step, for the ground-truth recorder (not what metrics show)."""

    first_at: F  # arrival times of requests that got their first token
    ttft: F
    done_at: F  # arrival times of completed requests
    done_ttft: F
    done_tpot: F  # mean inter-token time of each completed request
    done_tokens: F  # prompt + output tokens of each completed request
    refused_at: F  # arrival times of refused requests
    first_deferred: B  # which of first_at are deferrable requests (not judged by the SLO)
    done_deadline: F  # the completed requests' deadlines (inf: interactive)
    done_end: F  # when they completed
    done_valley: B  # deferred and released into spare capacity
    refused_deadline: F  # the refused requests' deadlines (inf: interactive)
    itl_gap: F  # step gaps seen by decoding sequences ...
    itl_weight: F  # ... and how many tokens saw each gap
    busy: F  # per slot, share of the step the replica computed


class Engines:
    """All replicas' queues and batches; slot `s` is one replica (pod) while it lives."""

    def __init__(self, profile: EngineProfile, limits: Limits, slots: int) -> None:
        self.profile, self.limits = profile, limits
        self.slots = slots
        self.counters = {name: np.zeros(slots) for name in COUNTERS + DEFERRED_COUNTERS}
        self.ttft_hist = np.zeros((slots, len(TTFT_BUCKETS) + 1))
        self.itl_hist = np.zeros((slots, len(ITL_BUCKETS) + 1))
        self._seq = 0
        z = np.zeros(0)
        zi = np.zeros(0, dtype=np.int64)
        self.rep, self.at, self.inp, self.out, self.cached = zi, z, zi, zi, zi
        self.left, self.gen, self.first, self.seq = z, z, z, zi
        self.running = np.zeros(0, dtype=bool)
        self.deadline, self.limit = z, z  # absolute deadline (inf: none), queue-wait limit
        self.low = self.valley = np.zeros(0, dtype=bool)  # lowest priority; released to spare

    # --- bookkeeping --------------------------------------------------------------------

    def reset_slot(self, slot: int) -> None:
        """A new pod in this slot: fresh counters, as a restarted process would export."""
        for c in self.counters.values():
            c[slot] = 0.0
        self.ttft_hist[slot] = 0.0
        self.itl_hist[slot] = 0.0

    def outstanding(self) -> F:
        """Requests per slot, queued or running (the router's least-loaded signal)."""
        placed = self.rep >= 0
        return np.bincount(self.rep[placed], minlength=self.slots).astype(float)

    def held(self) -> int:
        return int(np.count_nonzero(self.rep < 0))

    def in_slot(self, slot: int) -> int:
        return int(np.count_nonzero(self.rep == slot))

    def add(self, batch: Batch, slots: IntA, deferred: Deferred | None = None) -> None:
        """New arrivals, placed on `slots` (-1: held by the router while no replica is ready);
        `deferred` gives deferrable ones their deadline, queue-wait limit and priority."""
        n = len(batch)
        if n == 0:
            return
        d = deferred or Deferred.none(n, self.limits.max_queue_wait_s)
        self.deadline = np.concatenate([self.deadline, d.deadline])
        self.limit = np.concatenate([self.limit, d.limit])
        self.low = np.concatenate([self.low, d.low])
        self.valley = np.concatenate([self.valley, d.valley])
        self.rep = np.concatenate([self.rep, slots])
        self.at = np.concatenate([self.at, batch.at])
        self.inp = np.concatenate([self.inp, batch.input])
        self.out = np.concatenate([self.out, batch.output])
        self.cached = np.concatenate([self.cached, batch.cached])
        self.left = np.concatenate([self.left, np.zeros(n)])
        self.gen = np.concatenate([self.gen, np.zeros(n)])
        self.first = np.concatenate([self.first, np.full(n, np.nan)])
        self.seq = np.concatenate([self.seq, np.arange(self._seq, self._seq + n)])
        self.running = np.concatenate([self.running, np.zeros(n, dtype=bool)])
        self._seq += n

    def place_held(self, slots: IntA) -> None:
        """Router-held requests go to replicas (in arrival order)."""
        held = np.flatnonzero(self.rep < 0)
        self.rep[held[: len(slots)]] = slots[: len(held)]

    def _keep(self, keep: B) -> None:
        for name in _ROWS:
            setattr(self, name, getattr(self, name)[keep])

    # --- one step -----------------------------------------------------------------------

    def step(self, t0: float, dt: float) -> StepOutcome:
        lim, n_slots = self.limits, self.slots
        t1 = t0 + dt
        # refusals: too long for the model, or waited past the queue limit
        too_long = self.inp + self.out > lim.max_model_len
        expired = ~self.running & ((t1 - self.at > self.limit) | too_long)
        refused_at = self.at[expired]
        refused_deadline = self.deadline[expired]
        placed_exp = expired & (self.rep >= 0)
        self.counters["refusals"] += np.bincount(self.rep[placed_exp], minlength=n_slots)
        if expired.any():
            self._keep(~expired)
        self._admit(dt)
        self._preempt()
        return self._run(t0, dt, t1, refused_at, refused_deadline)

    def _admit(self, dt: float) -> None:
        """Waiting -> running, first come first served, while a slot, KV room for the prompt and
        prefill budget are left: as vLLM's scheduler takes a waiting request only when the step's
        token budget has room, prompts this step cannot start on stay queued (and are counted as
        waiting)."""
        lim, n_slots = self.limits, self.slots
        run = self.running
        n_run = np.bincount(self.rep[run], minlength=n_slots)
        kv_used = np.bincount(self.rep[run], self.inp[run] + self.gen[run], minlength=n_slots)
        wait = np.flatnonzero(~run & (self.rep >= 0))
        if len(wait) == 0:
            return
        order = wait[np.lexsort((self.seq[wait], self.low[wait], self.rep[wait]))]
        r = self.rep[order]
        prefill = self._prefill_need(order)
        start = np.r_[True, r[1:] != r[:-1]]
        group_first = np.maximum.accumulate(np.where(start, np.arange(len(r)), 0))
        rank = np.arange(len(r)) - group_first
        need = (self.inp[order] + self.gen[order] + 1).astype(float)
        gcs = _group_cumsum(need, group_first)
        ahead = _group_cumsum(prefill, group_first) - prefill
        backlog, budget = self._prefill_budget(dt)
        ok = (
            (rank < lim.max_num_seqs - n_run[r])
            & (gcs <= lim.kv_tokens - kv_used[r])
            & (backlog[r] + ahead < budget[r])
        )
        # first-come first-served: nothing behind a request that does not fit
        blocked = np.maximum.accumulate(np.where(~ok, np.arange(len(r)), -1))
        ok &= ~(blocked >= group_first)
        admitted = order[ok]
        self.running[admitted] = True
        self.left[admitted] = prefill[ok]

    def _prefill_need(self, idx: IntA) -> F:
        """Prompt tokens to compute: past the cached prefix, or everything again if preempted."""
        fresh = self.gen[idx] == 0
        need = self.inp[idx] + self.gen[idx] - np.where(fresh, self.cached[idx], 0)
        return np.maximum(need, 1).astype(float)

    def _prefill_budget(self, dt: float) -> tuple[F, F]:
        """Per slot: prefill tokens already admitted, and how many this step can compute."""
        p, lim, n = self.profile, self.limits, self.slots
        r_idx = np.flatnonzero(self.running)
        rep = self.rep[r_idx]
        decoding = self.left[r_idx] <= 0
        bd = np.bincount(rep[decoding], minlength=n).astype(float)
        n_all = np.bincount(rep, minlength=n).astype(float)
        ctx_sum = np.bincount(rep, self.inp[r_idx] + self.gen[r_idx], minlength=n)
        ctx = np.divide(ctx_sum, n_all, out=np.zeros(n), where=n_all > 0)
        t_d = np.where(bd > 0, p.decode_step(bd, ctx), 0.0)
        chunk = np.maximum(lim.max_num_batched_tokens - bd, 1.0)
        step = t_d + chunk / p.prefill_rate(chunk)
        backlog = np.bincount(rep, np.clip(self.left[r_idx], 0, None), minlength=n)
        return backlog.astype(np.float64), np.asarray(dt / step * chunk, dtype=np.float64)

    def _preempt(self) -> None:
        lim = self.limits
        run = np.flatnonzero(self.running)
        kv = np.bincount(self.rep[run], self.inp[run] + self.gen[run], minlength=self.slots)
        for slot in np.flatnonzero(kv > lim.kv_tokens):
            mine = run[self.rep[run] == slot]
            newest = mine[np.argsort(-self.seq[mine])]
            freed = np.cumsum(self.inp[newest] + self.gen[newest])
            over = kv[slot] - lim.kv_tokens
            victims = newest[: int(np.searchsorted(freed, over)) + 1]
            self.running[victims] = False  # recompute: prefill prompt + generated again
            self.counters["preemptions"][slot] += len(victims)
            self.counters["deferred_preemptions"][slot] += int(self.low[victims].sum())

    def _run(
        self, t0: float, dt: float, t1: float, refused_at: F, refused_deadline: F
    ) -> StepOutcome:
        p, lim, n_slots = self.profile, self.limits, self.slots
        run = self.running
        r_idx = np.flatnonzero(run)
        rep = self.rep[r_idx]
        decoding = self.left[r_idx] <= 0
        bd = np.bincount(rep[decoding], minlength=n_slots).astype(float)
        ctx_sum = np.bincount(rep, self.inp[r_idx] + self.gen[r_idx], minlength=n_slots)
        n_all = np.bincount(rep, minlength=n_slots).astype(float)
        ctx = np.divide(ctx_sum, n_all, out=np.zeros(n_slots), where=n_all > 0)
        backlog = np.bincount(rep, np.clip(self.left[r_idx], 0, None), minlength=n_slots)
        t_d = np.where(bd > 0, p.decode_step(bd, ctx), 0.0)
        chunk = np.minimum(np.maximum(lim.max_num_batched_tokens - bd, 1.0), backlog)
        rate = p.prefill_rate(np.maximum(chunk, 1.0))
        t_mixed = t_d + chunk / rate
        has_pf = backlog > 0
        need_mixed = np.divide(backlog, chunk, out=np.zeros(n_slots), where=has_pf)
        fits = need_mixed * t_mixed <= dt
        safe_tm = np.where(t_mixed > 0, t_mixed, 1.0)
        n_mixed = np.where(fits, need_mixed, dt / safe_tm)
        pre_done = np.where(fits, backlog, n_mixed * chunk)
        rest = np.where(fits, dt - need_mixed * t_mixed, 0.0)
        n_pure = np.divide(rest, t_d, out=np.zeros(n_slots), where=t_d > 0)
        n_tot = n_mixed + n_pure
        busy = np.minimum((n_mixed * t_mixed + n_pure * t_d) / dt, 1.0)

        # prefill progress, first-come first-served within each replica
        pf = r_idx[~decoding]
        first_at = ttft = np.zeros(0)
        first_deferred = np.zeros(0, dtype=bool)
        new_first = np.zeros(0, dtype=np.int64)
        after = np.zeros(0)
        if len(pf):
            pf = pf[np.lexsort((self.seq[pf], self.low[pf], self.rep[pf]))]
            pr = self.rep[pf]
            left = self.left[pf]
            start = np.r_[True, pr[1:] != pr[:-1]]
            group_first = np.maximum.accumulate(np.where(start, np.arange(len(pr)), 0))
            c = _group_cumsum(left, group_first)
            done = c <= pre_done[pr] + 1e-6
            finish = _fifo_finish(
                np.maximum(self.at[pf], t0), left * t_mixed[pr] / chunk[pr], pr, group_first
            )
            self.left[pf] = np.clip(c - pre_done[pr], 0.0, left)
            new_first = pf[done]
            nr = pr[done]
            fresh = np.isnan(self.first[new_first])
            got = np.minimum(finish[done], t1)
            self.first[new_first] = np.where(fresh, got, self.first[new_first])
            first_at = self.at[new_first][fresh]
            ttft = (got - self.at[new_first])[fresh]
            after = np.maximum(n_tot[nr] - c[done] / np.maximum(chunk[nr], 1.0), 0.0)
            prompts = self.inp[new_first].astype(float)
            self.counters["prompt_tokens"] += np.bincount(
                nr[fresh], prompts[fresh], minlength=n_slots
            )
            self._count_deferred(new_first[fresh], prompts[fresh])
            first_deferred = np.isfinite(self.deadline[new_first][fresh])
            # the engine's kvscale_engine_time_to_first_token_seconds{deferrable="false"}, which
            # the operator reads: deferred work at the lowest priority starts late by design
            shown = ~self.low[new_first][fresh]
            self._hist(self.ttft_hist, TTFT_BUCKETS, nr[fresh][shown], ttft[shown], None)

        # decode: one token per step per decoding sequence; the prefill step yields the first
        dec = r_idx[decoding]
        tokens = np.concatenate([n_tot[self.rep[dec]], 1.0 + after])
        who = np.concatenate([dec, new_first])
        room = self.out[who] - self.gen[who]
        got_tokens = np.minimum(tokens, room)
        self.gen[who] += got_tokens
        self.counters["generation_tokens"] += np.bincount(
            self.rep[who], got_tokens, minlength=n_slots
        )
        self._count_deferred(who, got_tokens)
        gap = np.concatenate([t_mixed, t_d])
        weight = np.concatenate(
            [n_mixed * bd, n_pure * (bd + np.bincount(self.rep[new_first], minlength=n_slots))]
        )
        slot_of = np.concatenate([np.arange(n_slots), np.arange(n_slots)])
        seen = (weight > 0) & (gap > 0)
        self._hist(self.itl_hist, ITL_BUCKETS, slot_of[seen], gap[seen], weight[seen])

        # completions
        finished = who[self.gen[who] >= self.out[who] - 1e-9]
        frac = np.divide(room, tokens, out=np.ones(len(who)), where=tokens > 0)
        end_at = t0 + dt * np.clip(frac, 0, 1)
        done_mask = self.gen[who] >= self.out[who] - 1e-9
        end_at = end_at[done_mask]
        tpot = np.where(
            self.out[finished] > 1,
            (end_at - self.first[finished]) / np.maximum(self.out[finished] - 1, 1),
            0.0,
        )
        self.counters["successes"] += np.bincount(self.rep[finished], minlength=n_slots)
        outcome = StepOutcome(
            first_at=first_at,
            ttft=ttft,
            done_at=self.at[finished],
            done_ttft=self.first[finished] - self.at[finished],
            done_tpot=np.maximum(tpot, 0.0),
            done_tokens=(self.inp[finished] + self.out[finished]).astype(float),
            refused_at=refused_at,
            itl_gap=gap[seen],
            itl_weight=weight[seen],
            busy=busy,
            first_deferred=first_deferred,
            done_deadline=self.deadline[finished],
            done_end=end_at,
            done_valley=self.valley[finished],
            refused_deadline=refused_deadline,
        )
        if len(finished):
            keep = np.ones(len(self.rep), dtype=bool)
            keep[finished] = False
            self._keep(keep)
        return outcome

    def _count_deferred(self, rows: IntA, tokens: F) -> None:
        deferred = np.isfinite(self.deadline[rows])
        if not deferred.any():
            return
        n = self.slots
        self.counters["deferred_tokens"] += np.bincount(
            self.rep[rows[deferred]], tokens[deferred], minlength=n
        )
        valley = deferred & self.valley[rows]
        self.counters["valley_tokens"] += np.bincount(
            self.rep[rows[valley]], tokens[valley], minlength=n
        )

    def gauges(self) -> tuple[F, F, F, F]:
        """Per slot: running, waiting, KV-cache usage (0..1) and, of the waiting, deferred work
        at the lowest priority, as the engine exports them."""
        run, n = self.running, self.slots
        placed = self.rep >= 0
        running = np.bincount(self.rep[run], minlength=n).astype(float)
        waiting = np.bincount(self.rep[placed & ~run], minlength=n).astype(float)
        deferred = np.bincount(self.rep[placed & ~run & self.low], minlength=n).astype(float)
        kv = np.bincount(self.rep[run], self.inp[run] + self.gen[run], minlength=n)
        return running, waiting, np.minimum(kv / self.limits.kv_tokens, 1.0), deferred

    def _hist(self, hist: F, buckets: F, slots: IntA, values: F, weights: F | None) -> None:
        if len(values) == 0:
            return
        idx = slots * hist.shape[1] + np.searchsorted(buckets, values, side="left")
        flat = np.bincount(idx, weights, minlength=hist.size)
        hist += flat.reshape(hist.shape)


_ROWS = (
    "rep", "at", "inp", "out", "cached", "left", "gen", "first", "seq", "running",
    "deadline", "limit", "low", "valley",
)  # fmt: skip


@dataclass(frozen=True)
class Deferred:
    """Per arriving request: absolute deadline (inf: interactive), queue-wait limit, whether it
    runs at the lowest priority, and whether it was released into spare capacity."""

    deadline: F
    limit: F
    low: B
    valley: B

    @classmethod
    def none(cls, n: int, limit_s: float) -> Deferred:
        no = np.zeros(n, dtype=bool)
        return cls(np.full(n, np.inf), np.full(n, limit_s), no, no)


def _fifo_finish(arrive: F, work: F, group: IntA, group_first: IntA) -> F:
    """Finish times of a first-come first-served server per group (replica), vectorised:
    finish_i = S_i + max_{j<=i} (arrive_j - S_{j-1}) with S the group's cumulative work."""
    total = _group_cumsum(work, group_first)
    key = arrive - (total - work)
    offset = group.astype(np.float64) * (np.abs(key).max(initial=0.0) * 2 + 1e6)
    return np.asarray(total + np.maximum.accumulate(key + offset) - offset, dtype=np.float64)


def _group_cumsum(values: F, group_first: IntA) -> F:
    """Cumulative sums restarting at each group (groups are contiguous runs)."""
    cs = np.cumsum(values)
    return cs - (cs[group_first] - values[group_first])
