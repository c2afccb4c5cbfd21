"""The database's outages as one API process sees them (issue 18, finding 7).

While Postgres is away every request that needs it fails alike; logging
each one (1,033 tracebacks in 34 s) buries the one fact worth knowing. An
outage is logged when its first failure is seen, with that moment, and
when the first statement succeeds again, with how long it lasted.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from sqlalchemy import Engine, event

log = logging.getLogger(__name__)

#: What a 503 for the database's absence tells the client to wait.
RETRY_AFTER_SECONDS = 2


def summary(error: BaseException) -> str:
    """The error's first line, without SQLAlchemy's trailing link."""
    text = str(getattr(error, "orig", None) or error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class Outage:
    """Whether the database is down, since when; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self.failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, error: BaseException) -> None:
        """A request met the database's absence: logged if it is the first."""
        with self._lock:
            self.failures += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        log.warning(
            "database unavailable since %s (%s); answering 503 until it is back",
            datetime.now(UTC).isoformat(timespec="seconds"),
            summary(error),
        )

    def succeeded(self) -> None:
        """A statement succeeded: the outage, if any, has ended."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is None:
                return
            lasted, self._since = time.monotonic() - self._since, None
            failures, self.failures = self.failures, 0
        log.warning(
            "database back after %.1f s of outage (%d requests answered 503)", lasted, failures
        )

    def watch(self, engine: Engine) -> None:
        """Learn of the end of an outage from ``engine``'s statements."""

        def executed(*_: object) -> None:
            self.succeeded()

        event.listen(engine, "after_cursor_execute", executed)
