"""The outbox relay: committed outbox rows → broker messages.

Rows are claimed ``FOR UPDATE SKIP LOCKED`` (so several relays share the work
without blocking), sent with the message id as the Celery task id, and marked
``published_at`` in the same transaction. A crash after sending and before
that commit leaves the rows unpublished: they are sent again with the same
id, and the consumer's ``processed_messages`` row turns the repeat into a
no-op. Nothing is lost either: a row is marked only after its send returned.

Redis holds only hints. A message sent but never processed (Redis restarted
without persistence) is sent again once ``republish_after`` has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

CHANNEL = "qm_outbox"

Send = Callable[[UUID, str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class RelayResult:
    sent: int
    republished: int = 0


_CLAIM = text(
    "SELECT message_id, topic, payload FROM outbox WHERE published_at IS NULL "
    "ORDER BY created_at LIMIT :limit FOR UPDATE SKIP LOCKED"
)
# Published long ago and still not processed by its consumer (consumer =
# topic): the broker lost it. Sending it again is safe, see above.
_STALE = text(
    "SELECT o.message_id, o.topic, o.payload FROM outbox o "
    "WHERE o.published_at < now() - make_interval(secs => :after) "
    "AND NOT EXISTS (SELECT FROM processed_messages p WHERE p.consumer = o.topic "
    "AND p.message_id = o.message_id AND p.processed_at IS NOT NULL) "
    "ORDER BY o.published_at LIMIT :limit FOR UPDATE OF o SKIP LOCKED"
)
_MARK = text("UPDATE outbox SET published_at = now() WHERE message_id = ANY(:ids)")
# A hint the relay gave itself is processed as its consumer would record it.
_HINTED = text(
    "INSERT INTO processed_messages (consumer, message_id, deliveries, processed_at, outcome) "
    "SELECT o.topic, o.message_id, 1, now(), 'done' FROM outbox o "
    "WHERE o.message_id = ANY(:ids) ON CONFLICT (consumer, message_id) DO NOTHING"
)

#: Topics whose whole effect is a hint (Redis pub/sub): ``{topic: give the hint}``.
Hints = Mapping[str, Callable[[], None]]


def relay_once(
    engine: Engine,
    send: Send,
    *,
    limit: int = 500,
    republish_after: float | None = None,
    before_mark: Callable[[], None] | None = None,
    hints: Hints | None = None,
) -> RelayResult:
    """Send one batch; ``before_mark`` is a test's hook for a crash after send.

    Rows of a ``hints`` topic are not sent as tasks: the relay gives the hint
    once for all of the batch's rows of that topic and records them
    processed. A task per row would cost a Celery delivery and two
    transactions for each submission only to publish the same pub/sub
    message; a batch's worth of them wakes the leader once anyway."""
    hints = hints or {}
    counts = []
    queries: list[tuple[Any, dict[str, float]]] = [(_CLAIM, {"limit": limit})]
    if republish_after is not None:
        queries.append((_STALE, {"limit": limit, "after": republish_after}))
    for query, params in queries:
        with engine.begin() as conn:
            rows = conn.execute(query, params).all()
            hinted = [r.message_id for r in rows if r.topic in hints]
            for message_id, topic, payload in rows:
                if topic not in hints:
                    send(message_id, topic, payload)
            for topic in sorted({r.topic for r in rows if r.topic in hints}):
                hints[topic]()
            if rows:
                if before_mark is not None:
                    before_mark()
                conn.execute(_MARK, {"ids": [r.message_id for r in rows]})
            if hinted:
                conn.execute(_HINTED, {"ids": hinted})
        counts.append(len(rows))
    return RelayResult(counts[0], counts[1] if len(counts) > 1 else 0)


def pending_count(engine: Engine) -> int:
    """Outbox depth: committed rows not yet sent."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            ).scalar_one()
        )


class Relay:
    """Runs ``relay_once`` whenever a transaction that wrote the outbox
    commits (LISTEN ``qm_outbox``, see migration 0005) and at least every
    ``poll_interval`` seconds, until ``stop`` is set."""

    def __init__(
        self,
        engine: Engine,
        send: Send,
        *,
        poll_interval: float = 1.0,
        republish_after: float = 300.0,
        limit: int = 500,
        hints: Hints | None = None,
        spacing: float = 0.05,
    ) -> None:
        self._engine = engine
        self._send = send
        self._hints = hints
        self._poll = poll_interval
        self._republish_after = republish_after
        self._limit = limit
        self._spacing = spacing
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with self._listen() as listener:
                    self._loop(listener)
            except (psycopg.Error, OSError):
                log.warning("outbox relay lost its database connection", exc_info=True)
                self.stop.wait(self._poll)

    def _listen(self) -> psycopg.Connection[Any]:
        url = make_url(self._engine.url).set(drivername="postgresql")
        conn = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def _loop(self, listener: psycopg.Connection[Any]) -> None:
        swept = -float("inf")
        while not self.stop.is_set():
            began = time.monotonic()
            # Messages the broker lost are looked for now and then, not on
            # every pass (they are ``republish_after`` old at least).
            sweep = began - swept >= min(self._republish_after / 10, 30.0)
            # LISTEN was issued before this pass, so no commit falls between.
            try:
                result = relay_once(
                    self._engine,
                    self._send,
                    limit=self._limit,
                    republish_after=self._republish_after if sweep else None,
                    hints=self._hints,
                )
            except Exception:
                log.exception("outbox relay pass failed; retrying")
                self.stop.wait(self._poll)
                continue
            if sweep:
                swept = began
            if result.sent < self._limit:
                # Spaced: every submission's commit notifies, and a pass per
                # notification (two transactions each) was the relay's whole
                # cost; the commits of the next ``spacing`` are one pass.
                self.stop.wait(max(0.0, began + self._spacing - time.monotonic()))
                self._wait(listener)

    def _wait(self, listener: psycopg.Connection[Any]) -> None:
        """Until a commit is notified or ``poll_interval`` passes, looking
        at ``stop`` every quarter second; then the notifications that came
        with it are taken too (one pass for all of them)."""
        deadline = time.monotonic() + self._poll
        while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
            heard = listener.notifies(timeout=min(left, 0.25), stop_after=1)
            try:
                woken = next(heard, None) is not None
            finally:
                heard.close()  # it holds the connection's lock while open
            if woken:
                # Consume what else is queued already: one pass serves it all.
                deque(listener.notifies(timeout=0.001), maxlen=0)
                return
