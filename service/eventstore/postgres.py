"""Postgres adapter of the event store.

Global order without skipped events
-----------------------------------
A ``BIGSERIAL`` position is handed out when a row is inserted, but becomes
visible when its transaction commits; a writer that took position 11 may commit
after another that took 12, and a reader that already read 12 would skip 11 for
ever (the "sequence gap" problem). Reading below the transaction-id horizon
(``pg_snapshot_xmin``) avoids that only if readers order by commit, not by
position, and it still leaves holes from rollbacks.

We serialise writers instead: every append updates the single row of
``event_head`` and holds that row lock until it commits. Postgres marks a
transaction committed (ProcArrayEndTransaction) *before* it releases its locks,
so the next writer can only take position p+1 after p is visible. Positions are
therefore gap-free (a rollback also undoes the counter) and become visible
strictly in order: a tailing reader may simply ask for ``position > last``.

The price is that appends commit one at a time. We keep the critical section to
one statement plus the commit: the idempotency and version checks run before the
lock is taken, and the unique key (stream, version) catches a writer that raced
us between the check and the lock. ``bench/eventstore.py`` measures the cost
against raw INSERTs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from service.eventstore.port import (
    ANY_VERSION,
    AppendResult,
    ConcurrencyConflict,
    EventMetadata,
    EventStoreError,
    NewEvent,
    RecordedEvent,
    check_batch,
    resolve_duplicates,
)

_T = TypeVar("_T")


class AppendRaced(EventStoreError):
    """A concurrent writer stored the same event_id first. The transaction is
    aborted; retrying the whole unit of work answers with the original position."""


_FIND_IDS = "SELECT event_id, stream, version, position FROM events WHERE event_id = ANY(%(ids)s)"
_STREAM_VERSION = "SELECT coalesce(max(version), 0) FROM events WHERE stream = %(stream)s"
_LOCK_HEAD = "SELECT position FROM event_head WHERE id = 1 FOR UPDATE"
# One statement takes the sequencer lock, allocates n positions and inserts.
_INSERT = """
WITH head AS (
    UPDATE event_head SET position = position + %(n)s WHERE id = 1
    RETURNING position - %(n)s AS base
), batch AS (
    SELECT e, ord FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS t(e, ord)
)
INSERT INTO events (position, stream, version, event_id, type, data, metadata)
SELECT head.base + batch.ord, %(stream)s, %(version)s + batch.ord,
       (batch.e->>'id')::uuid, batch.e->>'type', batch.e->'data', batch.e->'meta'
FROM head, batch
RETURNING position
"""
_READ_COLUMNS = "position, stream, version, event_id, type, data, metadata, recorded_at"


def _encode_batch(events: Sequence[NewEvent]) -> str:
    return json.dumps(
        [
            {
                "id": str(e.event_id),
                "type": e.type,
                "data": e.data,
                "meta": e.metadata.to_json(),
            }
            for e in events
        ],
        allow_nan=False,
        separators=(",", ":"),
    )


def _row_to_event(row: Sequence[Any]) -> RecordedEvent:
    position, stream, version, event_id, type_, data, meta, recorded_at = row
    return RecordedEvent(
        position=int(position),
        stream=str(stream),
        version=int(version),
        event_id=event_id if isinstance(event_id, UUID) else UUID(str(event_id)),
        type=str(type_),
        data=data,
        metadata=EventMetadata.from_json(meta),
        recorded_at=recorded_at,
    )


class PostgresEventRecorder:
    """Event store operations inside the caller's transaction (``conn``).

    The unit of work owns the transaction; nothing here commits.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def append(
        self, stream: str, expected_version: int, events: Sequence[NewEvent]
    ) -> AppendResult:
        check_batch(stream, events)
        replay = resolve_duplicates(stream, events, self._find_ids(events))
        if replay is not None:
            return replay
        if expected_version == ANY_VERSION:
            # No version to check against: take the lock first so that the
            # version we read cannot change before we insert.
            self._scalar(_LOCK_HEAD, {})
            current = self.stream_version(stream)
        else:
            current = self.stream_version(stream)
            if current != expected_version:
                raise ConcurrencyConflict(stream, expected_version, current)
        positions = self._insert(stream, current, expected_version, events)
        return AppendResult(stream, current + len(events), positions)

    def _insert(
        self, stream: str, current: int, expected: int, events: Sequence[NewEvent]
    ) -> tuple[int, ...]:
        params = {"n": len(events), "batch": _encode_batch(events), "stream": stream}
        try:
            rows = self._conn.exec_driver_sql(_INSERT, {**params, "version": current}).all()
        except IntegrityError as error:
            constraint = getattr(getattr(error.orig, "diag", None), "constraint_name", "")
            if constraint == "uq_events_event_id":
                raise AppendRaced(f"stream {stream!r}: event id appended concurrently") from error
            raise ConcurrencyConflict(stream, expected, None) from error
        return tuple(sorted(int(r[0]) for r in rows))

    def _find_ids(self, events: Sequence[NewEvent]) -> Mapping[UUID, tuple[str, int, int]]:
        rows = self._conn.exec_driver_sql(_FIND_IDS, {"ids": [e.event_id for e in events]})
        return {r[0]: (r[1], int(r[2]), int(r[3])) for r in rows}

    def _scalar(self, sql: str, params: Mapping[str, Any]) -> int:
        value = self._conn.exec_driver_sql(sql, dict(params)).scalar_one()
        return int(value)

    def read_stream(self, stream: str, after_version: int = 0) -> list[RecordedEvent]:
        rows = self._conn.exec_driver_sql(
            f"SELECT {_READ_COLUMNS} FROM events WHERE stream = %(stream)s "
            "AND version > %(after)s ORDER BY version",
            {"stream": stream, "after": after_version},
        )
        return [_row_to_event(r) for r in rows]

    def read_all(self, after_position: int, limit: int = 1000) -> list[RecordedEvent]:
        rows = self._conn.exec_driver_sql(
            f"SELECT {_READ_COLUMNS} FROM events WHERE position > %(after)s "
            "ORDER BY position LIMIT %(limit)s",
            {"after": after_position, "limit": limit},
        )
        return [_row_to_event(r) for r in rows]

    def stream_version(self, stream: str) -> int:
        return self._scalar(_STREAM_VERSION, {"stream": stream})

    def head_position(self) -> int:
        return self._scalar("SELECT position FROM event_head WHERE id = 1", {})


class PostgresEventStore:
    """The recorder with a transaction per call: for readers, tools and tests.

    Commands go through the unit of work instead, so that their events, outbox
    rows and ledger entries commit together.
    """

    def __init__(self, engine: Engine, retries: int = 3) -> None:
        self._engine = engine
        self._retries = retries

    @contextmanager
    def _recorder(self) -> Iterator[PostgresEventRecorder]:
        with self._engine.begin() as conn:
            yield PostgresEventRecorder(conn)

    def _run(self, operation: Callable[[PostgresEventRecorder], _T]) -> _T:
        for attempt in range(self._retries + 1):
            try:
                with self._recorder() as recorder:
                    return operation(recorder)
            except AppendRaced:
                if attempt == self._retries:
                    raise
        raise AssertionError("unreachable")

    def append(
        self, stream: str, expected_version: int, events: Sequence[NewEvent]
    ) -> AppendResult:
        return self._run(lambda r: r.append(stream, expected_version, events))

    def read_stream(self, stream: str, after_version: int = 0) -> list[RecordedEvent]:
        return self._run(lambda r: r.read_stream(stream, after_version))

    def read_all(self, after_position: int, limit: int = 1000) -> list[RecordedEvent]:
        return self._run(lambda r: r.read_all(after_position, limit))

    def stream_version(self, stream: str) -> int:
        return self._run(lambda r: r.stream_version(stream))

    def head_position(self) -> int:
        return self._run(lambda r: r.head_position())
