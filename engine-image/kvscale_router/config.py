"""The router's settings, validated once at the edge."""

from __future__ import annotations

from dataclasses import dataclass

from kvscale_router.admission import TrafficClass
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
