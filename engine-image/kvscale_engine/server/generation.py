"""One HTTP request's generation: n engine requests, read from one queue, timed for metrics.

Closing a generation aborts whatever is unfinished (the engine frees its KV blocks before its next
step) and hands the admission slot back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kvscale_engine.engine.outputs import RequestOutput
from kvscale_engine.server.admission_queue import Admitted
from kvscale_engine.server.engine_runner import EngineRunner, Item
from kvscale_engine.server.metrics import EngineMetrics, FinishedRequest


@dataclass
class Track:
    index: int
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished: bool = False
    final: RequestOutput | None = None

    @property
    def generated(self) -> int:
        return len(self.final.output_token_ids) if self.final else 0


@dataclass
class Generation:
    """The engine requests behind one HTTP request (n of them), read from one queue."""

    runner: EngineRunner
    metrics: EngineMetrics
    release: Callable[[Admitted], None]
    admitted: Admitted
    num_prompt_tokens: int
    stream: asyncio.Queue[Item]
    tracks: dict[str, Track] = field(default_factory=dict)
    closed: bool = False

    async def events(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) as the engine produces them, until every choice finished."""
        while not all(t.finished for t in self.tracks.values()):
            item = await self.stream.get()
            if isinstance(item, BaseException):
                raise item
            track = self.tracks[item.request_id]
            self._observe(track, item)
            yield track.index, item

    def close(self) -> None:
        """Abort what is unfinished and give back the admission slot; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        now = time.monotonic()
        for request_id, track in self.tracks.items():
            if not track.finished:
                self.runner.abort(request_id)
                self._finished(track, "abort", track.generated, None, now)
        self.admitted.used_tokens = sum(
            self.num_prompt_tokens + t.generated for t in self.tracks.values()
        )
        self.release(self.admitted)

    def _observe(self, track: Track, out: RequestOutput) -> None:
        now = time.monotonic()
        track.final = out
        metrics = self.metrics
        if out.new_token_ids:
            if track.first_token_at is None:
                track.first_token_at = now
                if self.admitted.first_token_at is None:
                    self.admitted.first_token_at = now
                cls = self.admitted.traffic_class.name
                metrics.observe_first_token(now - self.admitted.arrival, cls)
            elif track.last_token_at is not None:
                metrics.observe_inter_token(now - track.last_token_at)
            track.last_token_at = now
        if out.finished:
            track.finished = True
            reason = out.finish_reason or "stop"
            self._finished(track, reason, len(out.output_token_ids), out.first_scheduled_time, now)

    def _finished(
        self, track: Track, reason: str, generated: int, scheduled: float | None, now: float
    ) -> None:
        track.finished = True
        arrival = self.admitted.arrival
        self.metrics.observe_finished(
            FinishedRequest(
                finish_reason=reason,
                e2e_s=now - arrival,
                queue_s=None if scheduled is None else max(0.0, scheduled - arrival),
                num_prompt_tokens=self.num_prompt_tokens,
                num_generation_tokens=generated,
            )
        )
