"""Hold-from-zero: while no replica is routable, requests wait (bounded in count and time).

The number waiting is the pending demand the capacity controller reads to scale up from zero;
a request is answered as soon as a replica becomes routable, or refused with 503 + Retry-After.
"""

from __future__ import annotations

import math
import time

from kvscale_router.admission import Refused
from kvscale_router.metrics import RouterMetrics
from kvscale_router.replicas import ReplicaTable


class Hold:
    def __init__(
        self, table: ReplicaTable, metrics: RouterMetrics, max_pending: int, timeout_s: float
    ) -> None:
        self.table = table
        self.metrics = metrics
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self.pending = 0

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.timeout_s))

    async def until_routable(self, traffic_class: str) -> float:
        """Seconds held (0 when a replica is routable now); raises Refused past the bounds."""
        if self.table.routable():
            return 0.0
        if self.pending >= self.max_pending:
            message = "No replica is ready and the router holds as many requests as it may."
            raise Refused(503, "pending_full", self.retry_after_s, traffic_class, message)
        start = time.monotonic()
        deadline = start + self.timeout_s
        self._count(+1)
        try:
            while not self.table.routable():
                left = deadline - time.monotonic()
                if left <= 0:
                    message = f"No replica became ready within {self.timeout_s:g} s."
                    retry = self.retry_after_s
                    raise Refused(503, "pending_timeout", retry, traffic_class, message)
                warm = self.table.next_warm_s()
                await self.table.changed(min(left, warm + 0.01) if warm is not None else left)
        finally:
            self._count(-1)
        held = time.monotonic() - start
        self.metrics.pending_wait.observe(held)
        return held

    def _count(self, step: int) -> None:
        self.pending += step
        self.metrics.pending_requests.set(self.pending)
