"""Picking: weight x prefix affinity x load."""

from __future__ import annotations

from collections import Counter

import pytest

from kvscale_router.picker import Picker
from kvscale_router.prefix import block_keys

ALL = {"a": 1.0, "b": 1.0, "c": 1.0}


def keys(prefix: int, tail: int = 0) -> list[int]:
    return block_keys([prefix] * 64 + [tail] * 16, 16, 32)


def test_a_shared_prefix_keeps_landing_on_one_replica() -> None:
    picker = Picker()
    first = picker.pick(keys(7), 100, ALL)
    assert first is not None and first.reason == "ring"
    for tail in range(5):
        again = picker.pick(keys(7, tail), 100, ALL)
        assert again is not None and again.name == first.name and again.reason == "affinity"


def test_affinity_spills_when_its_replica_is_overloaded() -> None:
    picker = Picker(epsilon=0.25)
    home = picker.pick(keys(7), 100, ALL)
    assert home is not None
    picker.started(home.name, 10_000)
    other = picker.pick(keys(7), 100, ALL)
    assert other is not None and other.name != home.name


def test_weight_zero_is_never_picked_and_weight_shapes_load() -> None:
    picker = Picker(policy="least-loaded")
    weights = {"a": 1.0, "b": 0.25, "c": 0.0}
    counts: Counter[str] = Counter()
    for _ in range(100):
        choice = picker.pick([], 10, weights)
        assert choice is not None
        picker.started(choice.name, 10)
        counts[choice.name] += 1
    assert counts["c"] == 0
    assert 3 <= counts["a"] / counts["b"] <= 5


def test_least_outstanding_tokens_breaks_ties() -> None:
    picker = Picker()
    picker.started("a", 500)
    picker.started("b", 100)
    choice = picker.pick([], 10, ALL)
    assert choice is not None and (choice.name, choice.reason) == ("c", "least_loaded")
    picker.finished("b", 100)
    picker.started("c", 50)
    assert picker.pick([], 10, ALL).name == "b"  # type: ignore[union-attr]


def test_idle_replicas_take_turns() -> None:
    """A light load whose requests finish before the next arrives reaches every replica, not
    the first name: a new replica behind an idle peer would otherwise never serve."""
    picker = Picker()
    counts: Counter[str] = Counter()
    for _ in range(30):
        choice = picker.pick([], 10, ALL)
        assert choice is not None and choice.reason == "least_loaded"
        picker.started(choice.name, 10)
        picker.finished(choice.name, 10)
        counts[choice.name] += 1
    assert counts == {"a": 10, "b": 10, "c": 10}
    picker.started("b", 10)  # a loaded replica is still passed over while the others are idle
    assert {picker.pick([], 10, ALL).name for _ in range(4)} == {"a", "c"}  # type: ignore[union-attr]


def test_exclusions_and_empty_sets() -> None:
    picker = Picker()
    assert picker.pick(keys(1), 10, {}) is None
    assert picker.pick(keys(1), 10, ALL, exclude={"a", "b", "c"}) is None
    only = picker.pick(keys(1), 10, ALL, exclude={"a", "b"})
    assert only is not None and only.name == "c"


def test_round_robin_cycles_over_serving_replicas() -> None:
    picker = Picker(policy="round-robin")
    names = [picker.pick(keys(1), 10, {**ALL, "b": 0.0}).name for _ in range(4)]  # type: ignore[union-attr]
    assert names == ["a", "c", "a", "c"]


def test_a_removed_replica_loses_its_prefixes() -> None:
    picker = Picker()
    home = picker.pick(keys(3), 10, ALL)
    assert home is not None
    picker.removed(home.name)
    assert len(picker.index) == 0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Picker(policy="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Picker(epsilon=0)


def test_a_prefix_every_replica_has_goes_to_the_least_loaded() -> None:
    """A system prompt all replicas served must not herd new conversations onto one."""
    picker = Picker()
    for name in ALL:
        picker.index.remember(keys(5)[:4], name)  # the shared system prompt's blocks
    picker.started("a", 300)
    picker.started("b", 100)
    choice = picker.pick(keys(5, tail=1), 10, ALL)  # a new conversation after that prompt
    assert choice is not None and (choice.name, choice.reason) == ("c", "affinity")
