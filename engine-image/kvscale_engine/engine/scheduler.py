"""Continuous batching: every step admits work up to a sequence cap and a token budget.

Running sequences go first (decodes and unfinished prefill chunks), most important first, then
waiting ones in priority order. A long prompt is split into chunks that fit the token budget, so it
cannot stall decoding. When blocks run out the least important running sequence (the newest
within its priority) is preempted by recompute and put back at the head of the waiting queue.
Preemptible sequences (deferred work) also make way for a more important arrival that cannot
start: it would otherwise wait for them to finish, since waiting sequences never preempt.
Queues change only in `schedule()` and `postprocess()` (and `abort`). No torch here.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.block_manager import BlockManager
from kvscale_engine.engine.sequence import FinishReason, Sequence, SequenceStatus

StopChecker = Callable[[Sequence], FinishReason | None]


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    start: int  # first position fed this step (== num_computed_tokens at schedule time)
    num_new_tokens: int
    samples: bool  # the step reaches the last known token, so it produces the next one

    @classmethod
    def of(cls, seq: Sequence, start: int, num_new_tokens: int) -> ScheduledSeq:
        return cls(seq, start, num_new_tokens, start + num_new_tokens == seq.num_tokens)

    @property
    def end(self) -> int:
        return self.start + self.num_new_tokens


@dataclass
class ScheduledBatch:
    seqs: list[ScheduledSeq] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.block_manager = block_manager
        self.clock = clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.preemptions_by_class: Counter[str] = Counter()  # by the victim's traffic class
        self.generation_tokens = 0
        self.computed_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        self._make_way()
        budget = self._schedule_running(batch, self.config.max_num_batched_tokens)
        if self.config.scheduling == "continuous" or not self.running:
            self._admit_waiting(batch, budget)
        for seq in self.waiting:
            seq.waiting_steps += 1
        self.computed_tokens += batch.num_tokens
        return batch

    def postprocess(
        self, batch: ScheduledBatch, token_ids: list[int], check_stop: StopChecker
    ) -> list[Sequence]:
        """Advance computed counts, append sampled tokens, retire finished sequences."""
        sampled = iter(token_ids)
        finished: list[Sequence] = []
        for item in batch.seqs:
            seq = item.seq
            seq.num_computed_tokens = item.end
            if not item.samples:
                continue
            seq.append_token(next(sampled))
            self.generation_tokens += 1
            reason = check_stop(seq)
            if reason is not None:
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    def abort(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = "abort"
        elif seq.status is SequenceStatus.RUNNING:
            self._finish(seq, "abort")

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        # most important first, oldest first within a priority: the preemption victim is always
        # the last one, so it is never a sequence already placed in this batch
        self.running.sort(key=lambda s: (-s.priority, s.arrival_time))
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._reserve(seq, num_new):
                break  # seq itself was preempted: nothing less important is left to run
            batch.seqs.append(ScheduledSeq.of(seq, seq.num_computed_tokens, num_new))
            budget -= num_new
            index += 1
        return budget

    def _reserve(self, seq: Sequence, num_new: int) -> bool:
        bm = self.block_manager
        while not bm.can_allocate(seq, seq.num_computed_tokens + num_new, []):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        bm.allocate(seq, seq.num_computed_tokens + num_new, [])
        bm.publish(seq, seq.num_computed_tokens + num_new)
        return True

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        bm = self.block_manager
        for seq in self._admission_order():
            if len(self.running) >= self.config.max_num_seqs or budget <= 0:
                return
            prefix = bm.lookup_prefix(seq)
            computed = len(prefix) * bm.block_size
            num_new = min(seq.num_tokens - computed, budget)
            if not bm.can_allocate(seq, computed + num_new, prefix):
                return  # head-of-line waits for blocks; smaller requests do not overtake it
            bm.allocate(seq, computed + num_new, prefix)
            bm.publish(seq, computed + num_new)  # a later admission may share them this step
            self.waiting.remove(seq)
            self.running.append(seq)
            seq.status = SequenceStatus.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = self.clock()
            batch.seqs.append(ScheduledSeq.of(seq, computed, num_new))
            budget -= num_new

    def _make_way(self) -> None:
        """Preempt preemptible running sequences of lower priority, least important and newest
        first, until the most important waiting sequence that is not preemptible could start."""
        arrivals = [s for s in self.waiting if not s.preemptible]
        if not arrivals:
            return
        head = max(arrivals, key=lambda s: (s.priority, -s.arrival_time))
        while True:
            victims = [s for s in self.running if s.preemptible and s.priority < head.priority]
            if not victims or self._could_start(head):
                return
            self._preempt(min(victims, key=lambda s: (s.priority, -s.arrival_time)))

    def _could_start(self, seq: Sequence) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        bm = self.block_manager
        prefix = bm.lookup_prefix(seq)
        computed = len(prefix) * bm.block_size
        first = min(seq.num_tokens - computed, self.config.max_num_batched_tokens)
        return bm.can_allocate(seq, computed + first, prefix)

    def _admission_order(self) -> list[Sequence]:
        """Higher priority first; waiting ages a sequence up one class every N steps, but never
        lifts deferred work past an interactive request (it would take the place `_make_way` just
        freed for that request, step after step)."""
        aging = self.config.priority_aging_steps
        return sorted(
            self.waiting, key=lambda s: (s.preemptible, -(s.priority + s.waiting_steps // aging))
        )

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        self.preemptions_by_class[seq.traffic_class] += 1

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
