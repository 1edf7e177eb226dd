"""Picking a replica: weight x prefix affinity x load.

`affinity` (the default): the deepest prompt-block key routed before goes back to a replica that
took it, while that replica is within its load bound (it carries at most (1 + epsilon) x its
weighted share of the outstanding tokens); when several took it (a system prompt every replica
has served), the one with the fewest outstanding tokens per unit weight wins, so a shared prefix
does not herd new conversations onto one replica. A prefix never seen walks the consistent-hash
ring from its first block with bounded load. Without prompt blocks, the least loaded replica
(equally loaded ones in turn: a light load whose requests never overlap still reaches them all).
`least-loaded` skips affinity; `round-robin` is the baseline the benchmark compares against.
Weights scale each replica's load bound; weight 0 takes no new request.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from kvscale_router.hashring import HashRing, bounded_pick, within_bound

Policy = Literal["affinity", "least-loaded", "round-robin"]
POLICIES: tuple[str, ...] = get_args(Policy)


@dataclass(frozen=True)
class Choice:
    name: str
    reason: Literal["affinity", "ring", "least_loaded", "round_robin"]


class AffinityIndex:
    """Recently routed prefix keys and the replicas that took them, least recently used first out.

    An approximation of the replicas' prefix caches: they evict too, so the index is bounded.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[int, frozenset[str]] = OrderedDict()

    def owners(self, keys: Sequence[int]) -> list[frozenset[str]]:
        """The replicas that took each key, deepest prefix first (unknown keys skipped)."""
        return [self._owners[k] for k in reversed(keys) if k in self._owners]

    def remember(self, keys: Sequence[int], owner: str) -> None:
        for key in keys:
            self._owners[key] = self._owners.get(key, frozenset()) | {owner}
            self._owners.move_to_end(key)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def forget(self, owner: str) -> None:
        for key in [k for k, v in self._owners.items() if owner in v]:
            rest = self._owners[key] - {owner}
            if rest:
                self._owners[key] = rest
            else:
                del self._owners[key]

    def __len__(self) -> int:
        return len(self._owners)


class Picker:
    """Load per replica (outstanding tokens, in-flight requests) and the picking rule."""

    def __init__(
        self, policy: Policy = "affinity", epsilon: float = 0.25, index_capacity: int = 65536
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
        if epsilon <= 0:
            raise ValueError("epsilon must be positive")
        self.policy = policy
        self.epsilon = epsilon
        self.index = AffinityIndex(index_capacity)
        self.tokens: dict[str, float] = {}
        self.in_flight: dict[str, int] = {}
        self._ring = HashRing.build(())
        self._turn = itertools.count()
        self._ties = itertools.count()

    def pick(
        self,
        keys: Sequence[int],
        cost: float,
        weights: Mapping[str, float],
        exclude: Collection[str] = (),
    ) -> Choice | None:
        live = {n: w for n, w in weights.items() if w > 0 and n not in exclude}
        if not live:
            return None
        if self.policy == "round-robin":
            names = sorted(live)
            return Choice(names[next(self._turn) % len(names)], "round_robin")
        if self.policy == "affinity" and keys:
            choice = self._affine(keys, cost, live)
            self.index.remember(keys, choice.name)
            return choice
        return Choice(self._least_loaded(live), "least_loaded")

    def _affine(self, keys: Sequence[int], cost: float, live: Mapping[str, float]) -> Choice:
        for owners in self.index.owners(keys):
            fits = [
                o for o in owners
                if o in live and within_bound(o, cost, self.tokens, live, self.epsilon)
            ]  # fmt: skip
            if fits:
                return Choice(self._least_loaded({o: live[o] for o in fits}), "affinity")
        if self._ring.names != frozenset(live):
            self._ring = HashRing.build(sorted(live))
        name = bounded_pick(self._ring, keys[0], cost, self.tokens, live, self.epsilon)
        return Choice(name, "ring") if name else Choice(self._least_loaded(live), "least_loaded")

    def _least_loaded(self, live: Mapping[str, float]) -> str:
        """The fewest outstanding tokens per unit weight, then the fewest requests in flight;
        equals take turns, so replicas that are all idle between requests share them."""

        def load(name: str) -> tuple[float, int]:
            return (self.tokens.get(name, 0.0) / live[name], self.in_flight.get(name, 0))

        lowest = min(load(n) for n in live)
        tied = sorted(n for n in live if load(n) == lowest)
        return tied[next(self._ties) % len(tied)]

    def started(self, name: str, cost: float) -> None:
        self.tokens[name] = self.tokens.get(name, 0.0) + cost
        self.in_flight[name] = self.in_flight.get(name, 0) + 1

    def finished(self, name: str, cost: float) -> None:
        self.tokens[name] = max(0.0, self.tokens.get(name, 0.0) - cost)
        self.in_flight[name] = max(0, self.in_flight.get(name, 0) - 1)

    def removed(self, name: str) -> None:
        """A replica left the set: its prefixes are gone with it."""
        self.index.forget(name)
