"""Consistent hashing with bounded load (Mirrokni, Thorup, Zadimoghaddam, 2018), weighted.

A key walks the ring clockwise from its hash and takes the first replica whose load is within
(1 + epsilon) times its weighted share of the total; so equal keys keep landing on one replica
until it is overloaded, and then spill to the next replica on the ring, not to a random one.
Adding or removing a replica moves only the keys next to its points.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

VIRTUAL_NODES = 64


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class HashRing:
    points: tuple[int, ...]
    owners: tuple[str, ...]

    @classmethod
    def build(cls, names: Sequence[str], virtual_nodes: int = VIRTUAL_NODES) -> HashRing:
        ring = sorted((_point(f"{name}#{i}"), name) for name in names for i in range(virtual_nodes))
        return cls(tuple(p for p, _ in ring), tuple(n for _, n in ring))

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.owners)

    def walk(self, key: int) -> Iterator[str]:
        """Each replica once, in ring order from the key's position."""
        if not self.points:
            return
        start = bisect.bisect_left(self.points, key % 2**64)
        seen: set[str] = set()
        for i in range(len(self.owners)):
            owner = self.owners[(start + i) % len(self.owners)]
            if owner not in seen:
                seen.add(owner)
                yield owner


def within_bound(
    name: str, cost: float, loads: Mapping[str, float], weights: Mapping[str, float], epsilon: float
) -> bool:
    """True when `name` carries no more than (1 + epsilon) x its weighted share of the load
    after this request is added (the ceil of the unweighted algorithm: an idle replica is always
    within its bound)."""
    weight = weights.get(name, 0.0)
    total_weight = sum(w for w in weights.values() if w > 0)
    if weight <= 0 or total_weight <= 0:
        return False
    total = sum(loads.get(n, 0.0) for n, w in weights.items() if w > 0) + cost
    return loads.get(name, 0.0) <= (1.0 + epsilon) * total * weight / total_weight


def bounded_pick(
    ring: HashRing,
    key: int,
    cost: float,
    loads: Mapping[str, float],
    weights: Mapping[str, float],
    epsilon: float,
) -> str | None:
    """The first replica clockwise from `key` within its load bound; None without candidates."""
    for name in ring.walk(key):
        if within_bound(name, cost, loads, weights, epsilon):
            return name
    return None
