"""The router's settings, validated once at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvscale_router.admission import TrafficClass
from kvscale_router.deferred import DeferralPolicy
from kvscale_router.picker import POLICIES, Policy


@dataclass(frozen=True)
class RouterConfig:
    block_size: int = 16  # the engine's KV block size: prefix keys cover whole blocks
    max_blocks: int = 32  # prompt blocks hashed for affinity
    policy: Policy = "affinity"
    epsilon: float = 0.25  # load bound: (1 + epsilon) x a replica's weighted share
    index_capacity: int = 65536  # prefix keys remembered
    warmup_s: float = 10.0  # a Ready pod the operator has not weighted yet waits this long
    max_pending: int = 256  # requests held while no replica is ready
    pending_timeout_s: float = 120.0
    max_attempts: int = 3  # replicas tried before the first byte reaches the client
    connect_timeout_s: float = 2.0
    traffic_classes: tuple[TrafficClass, ...] = (TrafficClass(),)
    # deferrable classes: a replica without a published token budget may carry this many
    # outstanding tokens per unit weight before it has no spare capacity; under hot_weight it
    # is hot and gets no deferred work (the routing law's own "hot" line)
    spare_tokens: float = 8192.0
    hot_weight: float = 0.5
    deferral: DeferralPolicy = field(default_factory=DeferralPolicy)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_blocks < 1:
            raise ValueError("block size and max blocks must be >= 1")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}")
        if self.epsilon <= 0:
            raise ValueError("epsilon must be > 0")
        if self.max_pending < 0 or self.pending_timeout_s < 0 or self.warmup_s < 0:
            raise ValueError("max pending, pending timeout and warm-up must be >= 0")
        if self.max_attempts < 1:
            raise ValueError("max attempts must be >= 1")
        if self.spare_tokens < 0 or not 0 <= self.hot_weight <= 1:
            raise ValueError("spare tokens must be >= 0 and the hot weight in [0, 1]")
