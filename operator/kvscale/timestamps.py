"""RFC 3339 timestamps as the Kubernetes API writes them (UTC, whole seconds, a `Z`).

Status fields, conditions' `lastTransitionTime`, Events and the routing ConfigMap all carry this
one format, so it is written here once.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def stamp(at: float) -> str:
    """`at` (seconds since the epoch) as `2026-01-02T03:04:05Z`."""
    return datetime.fromtimestamp(at, UTC).strftime(FORMAT)


def now() -> str:
    return stamp(time.time())


def parse(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (fractions allowed); None if absent or bad."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
