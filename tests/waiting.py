"""Waiting for a condition, the one way tests do.

A test never asserts how fast something happened: it waits until it has
happened, up to a ceiling that only bounds a hang. The ceiling is generous,
because a wait ends as soon as its condition holds (a green run never pays
for it) and a busy CI runner is several times slower than a quiet laptop.
How fast things are is measured in bench/, not here.

On time-out the failure names what was waited on and what was seen last.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Seconds a test waits for something a quiet machine does in a second or two.
CEILING = 60.0
#: For waits on whole processes (start-up, a fleet's worth of work).
LONG_CEILING = 300.0


class NotYet(AssertionError):
    """A condition did not hold within its ceiling."""


def wait_for(
    condition: Callable[[], Any],
    ceiling: float = CEILING,
    what: str = "",
    *,
    interval: float = 0.05,
    seen: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that.

    ``what`` says what is awaited; ``seen`` describes the state when the
    condition's own value (often just ``False``) would say nothing."""
    deadline = time.monotonic() + ceiling
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            last = seen() if seen is not None else value
            name = what or getattr(condition, "__qualname__", repr(condition))
            raise NotYet(f"waited {ceiling:g} s for {name}; last seen: {last!r}")
        time.sleep(interval)
