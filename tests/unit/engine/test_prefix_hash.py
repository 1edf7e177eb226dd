"""Chained block hashes name a whole prefix, and only full blocks get one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvscale_engine.engine.prefix_hash import NO_PARENT, block_hash, chain_hashes


def test_only_full_blocks_are_hashed() -> None:
    assert len(chain_hashes(list(range(9)), 4, "")) == 2
    assert chain_hashes([1, 2, 3], 4, "") == []


def test_hash_depends_on_parent_and_salt() -> None:
    assert block_hash(NO_PARENT, [1, 2], "a") != block_hash(NO_PARENT, [1, 2], "b")
    assert block_hash(1, [1, 2], "a") != block_hash(2, [1, 2], "a")


@given(
    a=st.lists(st.integers(0, 1000), min_size=8, max_size=8),
    b=st.lists(st.integers(0, 1000), min_size=8, max_size=8),
)
def test_equal_hashes_mean_equal_prefixes(a: list[int], b: list[int]) -> None:
    ha, hb = chain_hashes(a, 4, ""), chain_hashes(b, 4, "")
    assert (ha[1] == hb[1]) == (a == b)
    assert (ha[0] == hb[0]) == (a[:4] == b[:4])
