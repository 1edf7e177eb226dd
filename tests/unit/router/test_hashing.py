"""Prefix keys and consistent hashing with bounded load."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvscale_router.hashring import HashRing, bounded_pick, within_bound
from kvscale_router.prefix import block_keys

NAMES = ("a", "b", "c", "d")


def test_equal_prefixes_share_keys_and_partial_blocks_get_none() -> None:
    one = block_keys(list(range(40)), 16, 8)
    two = block_keys([*range(32), 99, 98], 16, 8)
    assert len(one) == 2 and one == two  # the third block is partial in both
    assert block_keys(list(range(15)), 16, 8) == []
    changed = block_keys([1000, *range(1, 40)], 16, 8)
    assert changed[0] != one[0] and changed[1] != one[1]  # chained: a key names the whole prefix


def test_text_is_cut_into_block_sized_chunks() -> None:
    system = "You are a helpful assistant. " * 10
    a = block_keys(system + "What is a KV cache?", 16, 32)
    b = block_keys(system + "Explain paged attention.", 16, 32)
    assert len(system) // 64 >= 4 and a[:4] == b[:4]
    assert len(block_keys("x" * 64 * 50, 16, 5)) == 5


def test_ring_walks_each_replica_once() -> None:
    ring = HashRing.build(NAMES)
    for key in (0, 1, 2**63, 2**64 - 1, 12345):
        assert sorted(ring.walk(key)) == sorted(NAMES)
    assert list(HashRing.build(()).walk(5)) == []


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.integers(0, 2**64 - 1), min_size=50, max_size=200))
def test_removing_a_replica_moves_only_its_keys(keys: list[int]) -> None:
    full, less = HashRing.build(NAMES), HashRing.build(NAMES[:-1])
    for key in keys:
        before = next(full.walk(key))
        if before != "d":
            assert next(less.walk(key)) == before


@settings(max_examples=200, deadline=None)
@given(
    loads=st.dictionaries(st.sampled_from(NAMES), st.floats(0, 1e5), min_size=1),
    weights=st.dictionaries(st.sampled_from(NAMES), st.floats(0, 1), min_size=1),
    key=st.integers(0, 2**64 - 1),
    cost=st.floats(1, 1e4),
)
def test_bounded_pick_respects_weights_and_bounds(
    loads: dict[str, float], weights: dict[str, float], key: int, cost: float
) -> None:
    ring = HashRing.build(NAMES)
    name = bounded_pick(ring, key, cost, loads, weights, 0.25)
    if not any(w > 0 for w in weights.values()):
        assert name is None
        return
    assert name is not None and weights[name] > 0
    assert within_bound(name, cost, loads, weights, 0.25)


def test_hot_key_spills_to_the_next_replica_on_the_ring() -> None:
    ring = HashRing.build(NAMES)
    weights = dict.fromkeys(NAMES, 1.0)
    order = list(ring.walk(42))
    loads = {order[0]: 1000.0}
    assert bounded_pick(ring, 42, 10, {}, weights, 0.25) == order[0]
    assert bounded_pick(ring, 42, 10, loads, weights, 0.25) == order[1]
