"""Scheduler: budgets, chunked prefill, preemption, priorities, static mode (no torch)."""

from __future__ import annotations

import math
from typing import Any

from bookkeeping_helpers import FakeRunner, check_block_invariants, stop_at_length
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale_engine.config import EngineConfig
from kvscale_engine.engine.block_manager import BlockManager
from kvscale_engine.engine.scheduler import Scheduler
from kvscale_engine.engine.sequence import Sequence, SequenceStatus
from kvscale_engine.sampling_params import SamplingParams


def make(num_blocks: int = 64, **overrides: Any) -> tuple[Scheduler, FakeRunner]:
    config = EngineConfig(model="dummy:test", **({"block_size": 4} | overrides))
    bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
    return Scheduler(config, bm, clock=lambda: 0.0), FakeRunner(config.block_size)


def add(
    s: Scheduler, rid: str, n: int, max_tokens: int = 4, priority: int = 0, arrival: float = 0.0
) -> Sequence:
    seq = Sequence(
        rid,
        [hash((rid, i)) % 50 for i in range(n)],
        SamplingParams(max_tokens=max_tokens),
        priority,
        arrival,
    )
    s.add(seq)
    return seq


def step(s: Scheduler, runner: FakeRunner) -> list[Sequence]:
    batch = s.schedule()
    return s.postprocess(batch, runner.run(batch), stop_at_length(s.config.max_model_len))


def test_long_prompt_is_chunked_while_others_decode() -> None:
    s, runner = make(max_num_batched_tokens=8)
    short = add(s, "short", 3, max_tokens=10)
    step(s, runner)
    add(s, "long", 30)
    batch = s.schedule()
    assert [(i.seq.request_id, i.num_new_tokens, i.samples) for i in batch.seqs] == [
        ("short", 1, True),
        ("long", 7, False),
    ]
    s.postprocess(batch, runner.run(batch), stop_at_length(2048))
    assert short.num_output_tokens == 2


def test_a_wave_with_one_new_prefix_computes_it_once_in_its_first_step() -> None:
    s, runner = make(max_num_batched_tokens=256)
    system = [7] * 16  # four blocks no request has computed yet
    wave = [
        Sequence(f"r{i}", [*system, i, i + 1, i + 2], SamplingParams(max_tokens=2))
        for i in range(4)
    ]
    for seq in wave:
        s.add(seq)
    batch = s.schedule()
    assert [(i.seq.request_id, i.start, i.num_new_tokens) for i in batch.seqs] == [
        ("r0", 0, 19), ("r1", 16, 3), ("r2", 16, 3), ("r3", 16, 3)
    ]  # fmt: skip
    assert [seq.num_cached_tokens for seq in wave] == [0, 16, 16, 16]
    # each later row attends over the prefix the first row writes in this very step
    s.postprocess(batch, runner.run(batch), stop_at_length(2048))
    check_block_invariants(s.block_manager, s.running)
    assert len({seq.block_table[3] for seq in wave}) == 1
    while s.has_unfinished():
        step(s, runner)
    assert s.block_manager.num_free_blocks == 64


def test_a_chunk_names_only_the_blocks_it_fills() -> None:
    s, runner = make(max_num_batched_tokens=10)
    a = Sequence("a", [3] * 24, SamplingParams(max_tokens=2))
    s.add(a)
    s.add(Sequence("b", [3] * 24 + [1], SamplingParams(max_tokens=2)))
    planned = []
    for _ in range(3):
        batch = s.schedule()
        planned.append([(i.seq.request_id, i.start, i.num_new_tokens) for i in batch.seqs])
        planned.append(a.num_hashed_blocks)
        s.postprocess(batch, runner.run(batch), stop_at_length(2048))
    assert planned == [
        [("a", 0, 10)], 2,  # blocks 0 and 1 full, block 2 half written: not named
        [("a", 10, 10)], 5,
        [("a", 20, 4), ("b", 24, 1)], 6,  # b shares the block a completes in the same step
    ]  # fmt: skip
    while s.has_unfinished():
        step(s, runner)
    check_block_invariants(s.block_manager, [])
    assert s.block_manager.num_free_blocks == 64


def test_finished_sequences_leave_at_once() -> None:
    s, runner = make()
    a = add(s, "a", 5, max_tokens=1)
    add(s, "b", 5, max_tokens=3)
    finished = step(s, runner)
    assert finished == [a] and a.status is SequenceStatus.FINISHED
    assert [q.request_id for q in s.running] == ["b"]


def test_newest_running_sequence_is_preempted_and_requeued_first() -> None:
    s, runner = make(num_blocks=4)
    old, new = add(s, "old", 7, max_tokens=8), add(s, "new", 7, max_tokens=8)
    add(s, "later", 3)
    step(s, runner)  # both prefilled: 2 blocks each, the pool is full
    step(s, runner)  # decode of token 8 still fits the second block
    step(s, runner)  # token 9 needs a third block for old -> new is preempted
    assert s.num_preemptions == 1
    assert new.status is SequenceStatus.WAITING and new.block_table == []
    assert s.waiting[0] is new and old.status is SequenceStatus.RUNNING


def test_preemption_evicts_the_lowest_priority_before_a_newer_urgent_request() -> None:
    s, runner = make(num_blocks=4)
    batch = add(s, "batch", 7, max_tokens=8, priority=0, arrival=1.0)
    step(s, runner)  # the batch request runs alone
    urgent = add(s, "interactive", 7, max_tokens=8, priority=10, arrival=2.0)
    step(s, runner)  # its prefill fills the pool
    step(s, runner)  # the batch request's next token needs a third block
    assert s.num_preemptions == 1
    assert batch.status is SequenceStatus.WAITING and batch.block_table == []
    assert urgent.status is SequenceStatus.RUNNING and urgent.num_output_tokens == 2


def deferred(s: Scheduler, rid: str, n: int, max_tokens: int = 8, arrival: float = 0.0) -> Sequence:
    seq = Sequence(rid, [hash((rid, i)) % 50 for i in range(n)],
                   SamplingParams(max_tokens=max_tokens), -1, arrival, "batch", True)  # fmt: skip
    s.add(seq)
    return seq


def test_an_interactive_arrival_preempts_deferred_work_to_start_at_once() -> None:
    s, runner = make(num_blocks=4)
    old = deferred(s, "old", 7, arrival=1.0)
    new = deferred(s, "new", 7, arrival=2.0)
    step(s, runner)  # both deferred requests hold 2 blocks each: the pool is full
    urgent = add(s, "interactive", 7, max_tokens=8, priority=0, arrival=3.0)
    step(s, runner)  # it cannot start without the newest deferred request's blocks
    assert urgent.status is SequenceStatus.RUNNING and urgent.num_output_tokens == 1
    assert new.status is SequenceStatus.WAITING and old.status is SequenceStatus.RUNNING
    assert s.num_preemptions == 1 and s.preemptions_by_class == {"batch": 1}


def test_a_full_batch_of_deferred_work_makes_way_for_an_arrival() -> None:
    s, runner = make(num_blocks=64, max_num_seqs=2)
    deferred(s, "a", 3, arrival=1.0)
    deferred(s, "b", 3, arrival=2.0)
    step(s, runner)
    urgent = add(s, "interactive", 3, priority=0, arrival=3.0)
    step(s, runner)
    assert urgent.status is SequenceStatus.RUNNING and s.preemptions_by_class == {"batch": 1}


def test_only_preemptible_work_of_lower_priority_makes_way() -> None:
    s, runner = make(num_blocks=4)
    add(s, "a", 7, max_tokens=8, priority=0, arrival=1.0)
    add(s, "b", 7, max_tokens=8, priority=0, arrival=2.0)
    step(s, runner)  # two interactive requests fill the pool: nobody is preempted for a third
    waiting = add(s, "c", 7, max_tokens=8, priority=5, arrival=3.0)
    step(s, runner)
    assert waiting.status is SequenceStatus.WAITING and s.num_preemptions == 0
    # deferred work that arrives waits behind, and never preempts anything itself
    s2, runner2 = make(num_blocks=4)
    deferred(s2, "x", 7, arrival=1.0)
    deferred(s2, "y", 7, arrival=2.0)
    step(s2, runner2)
    late = deferred(s2, "z", 7, arrival=3.0)
    step(s2, runner2)
    assert late.status is SequenceStatus.WAITING and s2.num_preemptions == 0


def test_deferred_work_that_waited_long_does_not_take_an_arrivals_place() -> None:
    s, runner = make(num_blocks=1024, max_num_seqs=2, priority_aging_steps=2)
    for n in range(4):  # two run, two wait and age past every interactive class
        deferred(s, f"d{n}", 4, max_tokens=400, arrival=float(n))
    for _ in range(20):
        step(s, runner)
    assert s.num_preemptions == 0
    urgent = add(s, "interactive", 4, max_tokens=4, priority=0, arrival=9.0)
    step(s, runner)
    assert urgent.status is SequenceStatus.RUNNING and s.num_preemptions == 1


def test_within_a_priority_the_newest_arrival_is_preempted() -> None:
    s, runner = make(num_blocks=6)
    old_batch = add(s, "old-batch", 7, max_tokens=8, priority=0, arrival=1.0)
    new_batch = add(s, "new-batch", 7, max_tokens=8, priority=0, arrival=2.0)
    step(s, runner)
    urgent = add(s, "interactive", 7, max_tokens=8, priority=10, arrival=3.0)
    step(s, runner)
    step(s, runner)
    assert s.num_preemptions == 1 and s.waiting[0] is new_batch
    assert old_batch.status is urgent.status is SequenceStatus.RUNNING


def test_higher_priority_is_admitted_first() -> None:
    s, _ = make(max_num_seqs=1)
    add(s, "low", 4, priority=0)
    add(s, "high", 4, priority=5)
    batch = s.schedule()
    assert [i.seq.request_id for i in batch.seqs] == ["high"]


def test_waiting_ages_low_priority_past_a_stream_of_high() -> None:
    s, runner = make(max_num_seqs=1, priority_aging_steps=2)
    add(s, "low", 4, max_tokens=1, priority=0)
    admitted: list[str] = []
    for n in range(12):
        add(s, f"high{n}", 4, max_tokens=1, priority=1)
        batch = s.schedule()
        admitted += [i.seq.request_id for i in batch.seqs]
        s.postprocess(batch, runner.run(batch), stop_at_length(2048))
    assert "low" in admitted


def test_static_mode_admits_only_when_the_batch_has_drained() -> None:
    s, runner = make(scheduling="static")
    add(s, "a", 4, max_tokens=3)
    step(s, runner)
    add(s, "b", 4, max_tokens=3)
    for _ in range(2):
        batch = s.schedule()
        assert [i.seq.request_id for i in batch.seqs] == ["a"]
        s.postprocess(batch, runner.run(batch), stop_at_length(2048))
    assert [i.seq.request_id for i in s.schedule().seqs] == ["b"]


requests = st.lists(
    st.tuples(
        st.integers(1, 40),  # prompt length
        st.integers(1, 12),  # max tokens
        st.integers(0, 2),  # priority
        st.integers(0, 3),  # shared prefix family
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=120, deadline=None)
@given(
    reqs=requests,
    num_blocks=st.integers(4, 40),
    block_size=st.sampled_from([1, 2, 4, 8]),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(1, 64),
    caching=st.booleans(),
    static=st.booleans(),
    aborts=st.lists(st.integers(0, 24), max_size=5),
)
def test_every_admitted_sequence_finishes_within_budgets(
    reqs: list[tuple[int, int, int, int]],
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    budget: int,
    caching: bool,
    static: bool,
    aborts: list[int],
) -> None:
    s, runner = make(
        num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
        scheduling="static" if static else "continuous",
        max_model_len=64,
    )
    seqs = []
    for n, (length, max_tokens, priority, family) in enumerate(reqs):
        if math.ceil(min(length + max_tokens, 64) / block_size) > num_blocks:
            continue  # the engine refuses requests that could never fit
        tokens = [family] * (length // 2) + [n % 7] * (length - length // 2)
        seq = Sequence(str(n), tokens, SamplingParams(max_tokens=max_tokens), priority)
        s.add(seq)
        seqs.append(seq)
    for steps in range(2000):
        if not s.has_unfinished():
            break
        if steps in aborts and steps < len(seqs) and not seqs[steps].is_finished:
            s.abort(seqs[steps])
        was_running = list(s.running)
        batch = s.schedule()
        assert batch.num_tokens <= budget
        assert len(s.running) <= max_num_seqs
        if static and was_running:
            assert all(i.seq in was_running for i in batch.seqs), "static mode admitted mid-batch"
        check_block_invariants(s.block_manager, s.running)
        for victim in (q for q in was_running if q.status is SequenceStatus.WAITING):
            assert all(victim.priority <= q.priority for q in s.running), "preempted out of order"
        s.postprocess(batch, runner.run(batch), stop_at_length(64))
        check_block_invariants(s.block_manager, s.running)
    assert not s.has_unfinished(), "a sequence never finished"
    for seq in seqs:
        assert seq.is_finished
        if seq.finish_reason == "length":
            assert seq.num_output_tokens == min(seq.params.max_tokens, 64 - seq.num_prompt_tokens)
    assert s.block_manager.num_free_blocks == num_blocks
