"""The unit of work: one transaction for a command's events, outbox messages
and ledger entries — they commit together or not at all. An event type the
registry (service/domain/events.py) does not declare is refused."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Self

from psycopg.types.json import Jsonb
from sqlalchemy import Connection, Engine, RootTransaction

from service.domain.events import require_registered
from service.eventstore.port import Accept, AppendResult, OutboxMessage
from service.eventstore.postgres import PostgresEventRecorder
from service.ledger.chain import LedgerEntry, NewLedgerEntry
from service.ledger.postgres import PostgresLedgerWriter

_OUTBOX = (
    "INSERT INTO outbox (message_id, topic, payload) VALUES (%(id)s, %(topic)s, %(payload)s) "
    "ON CONFLICT (message_id) DO NOTHING"
)


class SqlUnitOfWork:
    """``with uow: uow.events.append(...); uow.publish(...); uow.commit()``.

    Leaving the block without ``commit()`` rolls everything back. ``accept``
    checks each appended event (``None``: any type, for the event store's
    own tests).
    """

    events: PostgresEventRecorder

    def __init__(self, engine: Engine, accept: Accept | None = require_registered) -> None:
        self._engine = engine
        self._accept = accept
        self._conn: Connection | None = None
        self._tx: RootTransaction | None = None

    def __enter__(self) -> Self:
        self._conn = self._engine.connect()
        self._tx = self._conn.begin()
        self.events = PostgresEventRecorder(self._conn, self._accept)
        # The sealed entries ride in the commit pipeline with the events.
        self._ledger = PostgresLedgerWriter(self._conn, defer=self.events.defer)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._conn is not None and self._tx is not None
        try:
            if self._tx.is_active:
                self._tx.rollback()
        finally:
            self._conn.close()
            self._conn = self._tx = None

    @property
    def connection(self) -> Connection:
        assert self._conn is not None, "use the unit of work in a with block"
        return self._conn

    def publish(self, messages: Sequence[OutboxMessage]) -> None:
        """Queue messages for the outbox relay; they exist only if we commit."""
        # Sent in the commit pipeline with the events (no round trip of its own).
        self.events.defer(
            _OUTBOX,
            [
                {"id": m.message_id, "topic": m.topic, "payload": Jsonb(dict(m.payload))}
                for m in messages
            ],
        )

    def record(self, entries: Sequence[NewLedgerEntry]) -> list[LedgerEntry]:
        """Chain ledger entries. Takes the ledger tip's lock until commit;
        event_head is only ever locked at commit, so the lock order is always
        ledger_head, then event_head."""
        return self._ledger.append(entries)

    def commit(self) -> list[AppendResult]:
        """Commit; answer every append of this unit with its final positions."""
        assert self._tx is not None
        return self.events.commit(self._tx.commit)
