"""Block manager: allocation, ref counts, the prefix cache and LRU eviction (no torch)."""

from __future__ import annotations

from bookkeeping_helpers import check_block_invariants
from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale_engine.engine.block_manager import BlockManager
from kvscale_engine.engine.sequence import Sequence
from kvscale_engine.sampling_params import SamplingParams

BS = 4


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams())


def admit(bm: BlockManager, s: Sequence) -> list[int]:
    prefix = bm.lookup_prefix(s)
    assert bm.can_allocate(s, s.num_tokens, prefix)
    bm.allocate(s, s.num_tokens, prefix)
    return prefix


def compute_all(bm: BlockManager, s: Sequence) -> None:
    s.num_computed_tokens = s.num_tokens
    bm.publish(s, s.num_tokens)


def test_allocates_enough_blocks_and_frees_them() -> None:
    bm = BlockManager(8, BS)
    s = seq(list(range(10)))
    admit(bm, s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 5
    bm.free(s)
    assert bm.num_free_blocks == 8 and s.block_table == []
    check_block_invariants(bm, [])


def test_prefix_hit_shares_full_computed_blocks_only() -> None:
    bm = BlockManager(8, BS)
    first = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    admit(bm, first)
    assert bm.lookup_prefix(seq([1, 2, 3, 4, 5, 6, 7, 8, 0])) == []  # nothing computed yet
    compute_all(bm, first)
    second = seq([1, 2, 3, 4, 5, 6, 7, 8, 0], "b")
    prefix = admit(bm, second)
    assert prefix == first.block_table[:2]
    assert second.num_computed_tokens == 8 and second.num_cached_tokens == 8
    assert bm.blocks[prefix[0]].ref_count == 2
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (18, 8)
    check_block_invariants(bm, [first, second])


def test_a_hit_always_leaves_one_token_to_compute() -> None:
    bm = BlockManager(8, BS)
    first = seq([1, 2, 3, 4, 5, 6, 7, 8])
    admit(bm, first)
    compute_all(bm, first)
    same = seq([1, 2, 3, 4, 5, 6, 7, 8], "b")
    assert len(bm.lookup_prefix(same)) == 1  # 8 tokens: only the first block may be reused


def test_freed_blocks_stay_cached_and_are_revived() -> None:
    bm = BlockManager(4, BS)
    first = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(bm, first)
    compute_all(bm, first)
    bm.free(first)
    assert bm.num_free_blocks == 4 and len(bm.free_cached) == 2
    again = seq([1, 2, 3, 4, 5, 6, 7, 8, 10], "b")
    assert len(admit(bm, again)) == 2
    check_block_invariants(bm, [again])


def test_eviction_takes_uncached_first_then_least_recently_freed() -> None:
    bm = BlockManager(3, BS)
    a, b = seq([1, 1, 1, 1, 0], "a"), seq([2, 2, 2, 2, 0], "b")
    admit(bm, a)
    compute_all(bm, a)
    bm.free(a)  # a's full block cached, its tail block uncached
    admit(bm, b)  # takes the two never-cached free blocks
    compute_all(bm, b)
    assert bm.lookup_prefix(seq([1, 1, 1, 1, 9])) != []
    bm.free(b)
    c = seq([3, 3, 3, 3, 3, 3, 3, 3, 3], "c")
    admit(bm, c)  # needs 3 blocks: evicts a's block (freed earliest) and b's
    assert bm.lookup_prefix(seq([1, 1, 1, 1, 9])) == []
    check_block_invariants(bm, [c])


def test_duplicate_content_is_not_registered_twice() -> None:
    bm = BlockManager(8, BS)
    a, b = seq([1, 2, 3, 4, 5], "a"), seq([1, 2, 3, 4, 6], "b")
    admit(bm, a)
    admit(bm, b)  # admitted before a computed anything: no hit
    compute_all(bm, a)
    compute_all(bm, b)
    assert len(bm.hash_to_block) == 1
    bm.free(a)
    bm.free(b)
    check_block_invariants(bm, [])


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["admit", "grow", "compute", "free"]),
            st.integers(0, 5),
            st.lists(st.integers(0, 2), min_size=1, max_size=14),
        ),
        max_size=40,
    ),
    num_blocks=st.integers(1, 12),
    caching=st.booleans(),
)
def test_no_leak_no_double_free_under_any_sequence_of_operations(
    ops: list[tuple[str, int, list[int]]], num_blocks: int, caching: bool
) -> None:
    bm = BlockManager(num_blocks, BS, caching)
    live: dict[int, Sequence] = {}
    for op, key, tokens in ops:
        s = live.get(key)
        if op == "admit" and s is None:
            new = seq(tokens, str(key))
            prefix = bm.lookup_prefix(new)
            if bm.can_allocate(new, new.num_tokens, prefix):
                bm.allocate(new, new.num_tokens, prefix)
                live[key] = new
        elif op == "grow" and s is not None:
            s.token_ids.extend(tokens[:3])
            if bm.can_allocate(s, s.num_tokens, []):
                bm.allocate(s, s.num_tokens, [])
            else:
                s.token_ids = s.token_ids[: -len(tokens[:3])]
        elif op == "compute" and s is not None:
            s.num_computed_tokens = len(s.block_table) and min(
                s.num_tokens, len(s.block_table) * BS
            )
            bm.publish(s, s.num_computed_tokens)
        elif op == "free" and s is not None:
            bm.free(live.pop(key))
        check_block_invariants(bm, live.values())
    for s in live.values():
        bm.free(s)
    check_block_invariants(bm, [])
    assert bm.num_free_blocks == num_blocks
