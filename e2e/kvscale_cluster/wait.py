"""Polling a condition until it holds: the only way tests and the launcher wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold within its timeout; the message names what was awaited."""


class GiveUp(Exception):
    """Raised by a predicate when the condition can never hold (say, a process died)."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 60.0,
    what: str = "condition",
    interval: float = 0.2,
) -> T:
    """Call ``predicate`` until it returns a truthy value and return that value.

    Exceptions raised by the predicate count as "not yet" (``GiveUp`` excepted, which ends the
    wait at once); the last one is named in the ``WaitTimeout`` raised after ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except GiveUp:
            raise
        except Exception as error:
            last_error = error
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise WaitTimeout(f"Timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)
