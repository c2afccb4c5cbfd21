"""Postgres adapter of the event store.

Writers serialise on the row of ``event_head`` while they number their
events, so positions are gap-free and become visible in order; the checks run
before the lock, and a commit sends its INSERTs (or COPY) and COMMIT in one
pipeline. Units of several appends commit asynchronously and then wait for a
synchronous flush, so that concurrent writers' WAL flushes overlap.
docs/eventstore.md says why, with its sources.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from uuid import UUID

import orjson
import psycopg
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from service.eventstore.port import (
    ANY_VERSION,
    Accept,
    AppendResult,
    ConcurrencyConflict,
    EventMetadata,
    NewEvent,
    RecordedEvent,
    check_batch,
    resolve_duplicates,
)

_T = TypeVar("_T")


_STREAM_VERSION = "SELECT coalesce(max(version), 0) FROM events WHERE stream = %(stream)s"
_FIND_IDS = "SELECT event_id, stream, version, position FROM events WHERE event_id = ANY(%(ids)s)"
# Appends without an expected version take a per-stream lock, so that the
# version the INSERT reads cannot move before they commit.
_LOCK_STREAM = "SELECT pg_advisory_xact_lock(hashtextextended(%(stream)s, 0))"
# One statement checks the expected version (raising QM409 on a mismatch,
# which aborts the transaction), takes the sequencer lock, allocates n
# positions and inserts. Its snapshot may predate a writer that committed
# while we waited for the lock: the unique key (stream, version) catches that.
_INSERT = """
WITH current AS (
    SELECT coalesce(max(version), 0) AS v FROM events WHERE stream = %(stream)s
), head AS (
    UPDATE event_head SET position = position + %(n)s + (
        SELECT CASE WHEN %(expected)s IN (-1, current.v) THEN 0
               ELSE qm_version_conflict(%(stream)s, %(expected)s, current.v) END
        FROM current)
    WHERE id = 1
    RETURNING position - %(n)s AS base
), batch AS (
    SELECT e, ord FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS t(e, ord)
)
INSERT INTO events (position, stream, version, event_id, type, data, metadata)
SELECT head.base + batch.ord, %(stream)s, current.v + batch.ord,
       (batch.e->>'id')::uuid, batch.e->>'type', batch.e->'data', batch.e->'meta'
FROM head, current, batch
RETURNING position, version
"""
# The same for the appends of a unit to several streams, in one statement:
# one turn at the sequencer and one row version of event_head for the unit
# (a statement per stream moved the head once each), the versions of every
# stream checked before the head moves.
_INSERT_MANY = """
WITH batch AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb) AS b(
        ord bigint, stream text, k integer, expected bigint,
        id uuid, type text, data jsonb, meta jsonb)
), current AS (
    SELECT s.stream, s.expected,
           coalesce((SELECT max(e.version) FROM events e WHERE e.stream = s.stream), 0) AS v
    FROM (SELECT DISTINCT stream, expected FROM batch) AS s
), head AS (
    UPDATE event_head SET position = position + %(n)s + (
        SELECT coalesce(sum(CASE WHEN c.expected IN (-1, c.v) THEN 0
                            ELSE qm_version_conflict(c.stream, c.expected, c.v) END), 0)
        FROM current AS c)
    WHERE id = 1
    RETURNING position - %(n)s AS base
)
INSERT INTO events (position, stream, version, event_id, type, data, metadata)
SELECT head.base + b.ord, b.stream, c.v + b.k, b.id, b.type, b.data, b.meta
FROM head, batch AS b JOIN current AS c ON c.stream = b.stream
RETURNING position, stream, version
"""
STAGE_THRESHOLD = 32
# Taken in one pipeline: the versions of the batch's streams, then the
# sequencer lock (moving the head by n). The versions are read before the
# lock, to keep it short: a stream appended to without an expected version is
# held by its advisory lock; one with an expected version may move after we
# read it, but then its rival's rows hold the versions ours are about to
# take, and the unique key (stream, version) refuses our COPY.
_TAKE_HEAD = "UPDATE event_head SET position = position + %(n)s WHERE id = 1 RETURNING position"
_VERSIONS = (
    "SELECT stream, max(version) FROM events WHERE stream = ANY(%(streams)s) GROUP BY stream"
)
_COPY_EVENTS = "COPY events (position, stream, version, event_id, type, data, metadata) FROM STDIN"

# See "The WAL flush outside the lock" in docs/eventstore.md.
_ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"
# A commit flushes the WAL only if its transaction wrote some (an xid alone
# does not do): a transactional logical message is the smallest such write,
# open to every role and harmless with any wal_level.
_FLUSH = "SELECT pg_logical_emit_message(true, 'quartermaster', 'flush')"

_READ_COLUMNS = "position, stream, version, event_id, type, data, metadata, recorded_at"


def wait_durable(conn: Connection) -> None:
    """Return once every transaction that committed before this call is on
    disk: commit ``conn``'s transaction, then commit one that writes WAL
    (synchronously), whose commit flushes the WAL through all earlier commit
    records. For readers that pass what they read outside the database."""
    conn.commit()
    conn.exec_driver_sql(_FLUSH)
    conn.commit()


def _json(value: Any) -> str:
    """Compact JSON of an event's data or metadata.

    orjson is much faster than ``json.dumps`` but writes NaN and infinities
    as ``null`` where the standard encoder refuses them, and refuses what the
    standard one accepts (non-string keys, integers past 64 bits). So output
    that holds a ``null`` (it may be a NaN) or that orjson refuses goes to the
    standard encoder, whose verdict stands.
    """
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        text = b"null"
    if b"null" in text:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    return text.decode()


def _encode_batch(events: Sequence[NewEvent]) -> str:
    return (
        "["
        + ",".join(
            f'{{"id":"{e.event_id}","type":{_json(e.type)},'
            f'"data":{_json(e.data)},"meta":{_json(e.metadata.to_json())}}}'
            for e in events
        )
        + "]"
    )


def _encode_many(pending: Sequence[_Pending]) -> str:
    """The rows of ``_INSERT_MANY``: each event with its ordinal in the unit,
    its stream, its ordinal in the stream's append and that append's expected
    version (metadata a unit usually shares encoded once)."""
    metas: dict[int, str] = {}
    rows, ordinal = [], 0
    for item in pending:
        stream = _json(item.stream)
        for k, event in enumerate(item.events, start=1):
            ordinal += 1
            meta = metas.get(id(event.metadata))
            if meta is None:
                meta = orjson.dumps(event.metadata.to_json()).decode()
                metas[id(event.metadata)] = meta
            rows.append(
                f'{{"ord":{ordinal},"stream":{stream},"k":{k},"expected":{item.expected},'
                f'"id":"{event.event_id}","type":{_json(event.type)},'
                f'"data":{_json(event.data)},"meta":{meta}}}'
            )
    return "[" + ",".join(rows) + "]"


def _copy_text(value: str) -> str:
    """A value as a field of COPY's text format."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\\", "\\\\").replace("\t", "\\t")
        value = value.replace("\n", "\\n").replace("\r", "\\r")
    return value


def _copy_tails(events: Sequence[NewEvent], metas: dict[int, str]) -> list[str]:
    """Each event's COPY line after its position, stream and version
    (``metas`` caches the encoded metadata a batch usually shares)."""
    tails = []
    for event in events:
        meta = metas.get(id(event.metadata))
        if meta is None:
            # Metadata holds strings and nulls only: no NaN to watch for.
            meta = _copy_text(orjson.dumps(event.metadata.to_json()).decode())
            metas[id(event.metadata)] = meta
        data = _copy_text(_json(event.data))
        tails.append(f"\t{event.event_id}\t{_copy_text(event.type)}\t{data}\t{meta}\n")
    return tails


def _row_tails(item: _Pending, version: int, tails: Sequence[str]) -> list[str]:
    """An append's COPY lines after their position, its events numbered from
    ``version + 1``."""
    stream = _copy_text(item.stream)
    return [f"\t{stream}\t{version + k}{tail}" for k, tail in enumerate(tails, start=1)]


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


@dataclass(frozen=True, slots=True)
class _Pending:
    stream: str
    expected: int
    events: Sequence[NewEvent]

    def params(self) -> dict[str, Any]:
        return {
            "n": len(self.events),
            "batch": _encode_batch(self.events),
            "stream": self.stream,
            "expected": self.expected,
        }


_VERSION_CONFLICT = "QM409"
_UNIQUE_VIOLATION = "23505"


def _diagnostics(error: Exception) -> tuple[str, str, str]:
    """(SQLSTATE, DETAIL, message) of a psycopg error, raw or wrapped."""
    diag = getattr(getattr(error, "orig", error), "diag", None)
    return (
        getattr(diag, "sqlstate", "") or "",
        getattr(diag, "message_detail", "") or "",
        getattr(diag, "message_primary", "") or "",
    )


def _explain(
    raw: psycopg.Connection[Any], error: Exception, pending: Sequence[_Pending]
) -> list[AppendResult]:
    """After a failed commit: a replay of appends that had all committed
    before answers with their original positions; anything else raises."""
    sqlstate, detail, message = _diagnostics(error)
    if not pending or sqlstate not in (_VERSION_CONFLICT, _UNIQUE_VIOLATION):
        raise error
    replays = _replays(raw, pending)
    if replays is not None:
        return replays
    if sqlstate == _VERSION_CONFLICT:
        stale = next(
            (p for p in pending if f"stream {p.stream}:" in message),
            next(p for p in pending if p.expected != ANY_VERSION),
        )
        actual = int(detail) if detail.isdigit() else None
        raise ConcurrencyConflict(stale.stream, stale.expected, actual) from error
    raced = _raced_stream(detail)
    item = next((p for p in pending if p.stream == raced), pending[0])
    raise ConcurrencyConflict(item.stream, item.expected, None) from error


_TAKEN_VERSION = re.compile(r"Key \(stream, version\)=\((.*), (\d+)\) already exists\.", re.S)


def _raced_stream(detail: str) -> str | None:
    """The stream whose version a rival writer took first, from the unique
    violation's DETAIL (``Key (stream, version)=(s, 3) already exists.``)."""
    match = _TAKEN_VERSION.fullmatch(detail)
    return match.group(1) if match else None


def _replays(
    raw: psycopg.Connection[Any], pending: Sequence[_Pending]
) -> list[AppendResult] | None:
    """Rolls the failed transaction back; the original results if every
    append's events were all stored before, else None."""
    ids = [e.event_id for p in pending for e in p.events]
    stored = {r[0]: (r[1], int(r[2]), int(r[3])) for r in raw.execute(_FIND_IDS, {"ids": ids})}
    raw.rollback()
    replays = [resolve_duplicates(p.stream, p.events, stored) for p in pending]
    if stored and all(r is not None for r in replays):
        return [r for r in replays if r is not None]
    return None


class PostgresEventRecorder:
    """Event store operations inside the caller's transaction (``conn``).

    The unit of work owns the transaction; nothing here commits.
    """

    def __init__(self, conn: Connection, accept: Accept | None = None) -> None:
        self._conn = conn
        self._accept = accept
        self.pending: list[_Pending] = []
        self.deferred: list[tuple[str, list[Mapping[str, Any]]]] = []

    def append(
        self, stream: str, expected_version: int, events: Sequence[NewEvent]
    ) -> AppendResult:
        """Queue an append; ``commit`` sends it. The result's positions are
        empty until then. ``accept(stream, type)`` (the unit of work's event
        registry) raises on an event it does not know, before anything is
        queued."""
        check_batch(stream, events)
        if self._accept is not None:
            for event in events:
                self._accept(stream, event.type)
        self.pending.append(_Pending(stream, expected_version, events))
        return AppendResult(stream, expected_version + len(events), ())

    def defer(self, sql: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Queue a statement (psycopg ``%(name)s`` parameters, once per row)
        to run in the commit pipeline before the appends, e.g. the inline
        projection of the events being appended. It commits or rolls back
        with them, and costs no round trip of its own."""
        if rows:
            self.deferred.append((sql, list(rows)))

    def commit(self, commit_transaction: Callable[[], None]) -> list[AppendResult]:
        """Send the queued appends and ``commit_transaction()``'s COMMIT in one
        pipeline (one round trip); answer each append with its positions.

        A stale expected version raises ``ConcurrencyConflict``. An append
        whose event ids were all stored before answers with the original
        positions (``duplicate=True``); the transaction is rolled back then,
        as the first, identical attempt already committed its effects.
        """
        pending, self.pending = self.pending, []
        deferred, self.deferred = self.deferred, []
        if not pending and not deferred:
            commit_transaction()
            return []
        raw = self._conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        streams = [item.stream for item in pending]
        total = sum(len(item.events) for item in pending)
        if total >= STAGE_THRESHOLD and len(set(streams)) == len(streams):
            return self._commit_staged(raw, pending, deferred, commit_transaction)
        together = len(pending) > 1 and len(set(streams)) == len(streams)
        # A unit of one append of a few events commits synchronously: the
        # second transaction would cost it more than the flush outside the
        # lock gains (docs/eventstore.md). Under load, units grow (the API's
        # group commit) and flush apart.
        flush_apart = len(pending) > 1
        cursors = []
        try:
            with raw.pipeline():
                if flush_apart:
                    raw.execute(_ASYNC_COMMIT)
                for sql, params in deferred:
                    raw.cursor().executemany(sql, params)
                for item in pending:
                    if item.expected == ANY_VERSION:
                        raw.execute(_LOCK_STREAM, {"stream": item.stream})
                    if not together:
                        cursors.append(raw.execute(_INSERT, item.params()))
                if together:
                    many = {"batch": _encode_many(pending), "n": total}
                    cursors.append(raw.execute(_INSERT_MANY, many))
                commit_transaction()
                if flush_apart:
                    raw.execute(_FLUSH)
                    raw.commit()
            rows = [cursor.fetchall() for cursor in cursors]
        except (psycopg.Error, DBAPIError) as error:
            # The pipeline left a failed transaction; end it so that the pool
            # gets the connection back clean, then explain the failure.
            raw.rollback()
            return _explain(raw, error, pending)
        if together:
            found: dict[str, list[Any]] = {}
            for position, stream, version in rows[0]:
                found.setdefault(str(stream), []).append((position, version))
            rows = [found[item.stream] for item in pending]
        return [
            AppendResult(
                item.stream,
                max(int(r[1]) for r in found_rows),
                tuple(sorted(int(r[0]) for r in found_rows)),
            )
            for item, found_rows in zip(pending, rows, strict=True)
        ]

    def _commit_staged(
        self,
        raw: psycopg.Connection[Any],
        pending: Sequence[_Pending],
        deferred: Sequence[tuple[str, list[Mapping[str, Any]]]],
        commit_transaction: Callable[[], None],
    ) -> list[AppendResult]:
        """Read the versions, take the lock, COPY the numbered rows, COMMIT
        (docs/eventstore.md, "Large batches")."""
        metas: dict[int, str] = {}
        tails = [_copy_tails(item.events, metas) for item in pending]
        # Rows of appends with an expected version are known but for their
        # position: built before the lock, so that under it only the
        # positions are written in.
        rows = [
            None if item.expected == ANY_VERSION else _row_tails(item, item.expected, t)
            for item, t in zip(pending, tails, strict=True)
        ]
        total = sum(len(t) for t in tails)
        try:
            with raw.pipeline():
                raw.execute(_ASYNC_COMMIT)
                for sql, params in deferred:
                    raw.cursor().executemany(sql, params)
                for item in pending:
                    if item.expected == ANY_VERSION:
                        raw.execute(_LOCK_STREAM, {"stream": item.stream})
                versions = raw.execute(_VERSIONS, {"streams": [p.stream for p in pending]})
                head = raw.execute(_TAKE_HEAD, {"n": total})
            row = head.fetchone()
            assert row is not None
            position = int(row[0]) - total
            current = {str(s): int(v) for s, v in versions.fetchall()}
            stale = next(
                (p for p in pending if p.expected not in (ANY_VERSION, current.get(p.stream, 0))),
                None,
            )
            if stale is not None:
                replays = _replays(raw, pending)
                if replays is not None:
                    return replays
                raise ConcurrencyConflict(
                    stale.stream, stale.expected, current.get(stale.stream, 0)
                )
            results: list[AppendResult] = []
            lines: list[str] = []
            for item, built, item_tails in zip(pending, rows, tails, strict=True):
                version = current.get(item.stream, 0) if built is None else item.expected
                item_rows = _row_tails(item, version, item_tails) if built is None else built
                first = position + 1
                for tail in item_rows:
                    position += 1
                    lines.append(f"{position}{tail}")
                results.append(
                    AppendResult(
                        item.stream, version + len(item_rows), tuple(range(first, position + 1))
                    )
                )
            with raw.cursor().copy(_COPY_EVENTS) as copy:
                copy.write("".join(lines))
            with raw.pipeline():
                commit_transaction()
                raw.execute(_FLUSH)
                raw.commit()
        except (psycopg.Error, DBAPIError) as error:
            raw.rollback()
            return _explain(raw, error, pending)
        return results

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

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _run(self, operation: Callable[[PostgresEventRecorder], _T]) -> _T:
        with self._engine.connect() as conn:
            transaction = conn.begin()
            recorder = PostgresEventRecorder(conn)
            outcome = operation(recorder)
            committed = recorder.commit(transaction.commit)
            return cast(_T, committed[0]) if committed else outcome

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
