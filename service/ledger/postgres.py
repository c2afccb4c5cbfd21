"""Ledger chain storage in Postgres."""

from __future__ import annotations

import contextlib
import itertools
import struct
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from sqlalchemy import Connection, Engine

from service.eventstore.postgres import wait_durable
from service.jsonio import dumps
from service.ledger.chain import (
    CHAIN_VERSION,
    LedgerEntry,
    NewLedgerEntry,
    PreparedEntry,
    Verification,
    prepare,
    verify_chain,
)
from service.ledger.checkpoint import Checkpoint, NoteVerifier
from service.ledger.export import ExportRecord
from service.ledger.query import LedgerQuery, select_statement
from service.ledger.schema import (
    ENTRY_MATCHES_CALL,
    ENTRY_MATCHES_CONSTRAINT,
    ENTRY_MATCHES_SOURCE,
)
from service.ledger.verify import StoredRow, VerifyReport, verify_ledger, verify_stored

_COLUMNS = "seq, entry_id, kind, recorded_at, body, prev_hash, entry_hash"
# Taking the tip's row lock serialises appenders until commit, for the same
# reason as event_head (see docs/eventstore.md): seq stays
# gap-free and every appender chains onto the committed tip. Unlike events,
# an entry's hash needs its predecessor's, so the lock must be taken before
# sealing and is held across round trips; we keep them to two (lock + look-up
# pipelined, then INSERT + tip move pipelined) before the caller's COMMIT.
_LOCK_TIP = "SELECT seq, entry_hash FROM ledger_head WHERE id = 1 FOR UPDATE"
# Runs after the lock is granted (pipelined statements run one after the
# other, and under READ COMMITTED each takes a fresh snapshot), so it sees
# every entry committed by the appender we waited for: no duplicate can slip in.
_FIND = "SELECT " + _COLUMNS + " FROM ledger_entries WHERE entry_id = ANY(%(ids)s)"
_INSERT = (
    "INSERT INTO ledger_entries (" + _COLUMNS + ", entry_bytes) VALUES "
    "(%(seq)s, %(entry_id)s, %(kind)s, %(recorded_at)s, %(body)s, %(prev_hash)s, %(entry_hash)s, "
    "%(entry_bytes)s)"
)
_RECORDS = (
    "SELECT seq, entry_id::text, kind, recorded_at, body, encode(prev_hash, 'hex'), "
    "encode(entry_hash, 'hex') FROM ledger_entries WHERE seq > %(after)s ORDER BY seq"
)
_MOVE_TIP = "UPDATE ledger_head SET seq = %(seq)s, entry_hash = %(entry_hash)s WHERE id = 1"

# The stored rows for verify_stored, as raw as Postgres sends them: binary COPY
# decodes no JSON, dates or UUIDs on either side (a SELECT of the full rows
# spends most of its time decoding ``body`` into dicts in Python).
_STORED = (
    "COPY (SELECT seq, prev_hash, entry_hash, entry_bytes FROM ledger_entries "
    "WHERE seq > {after} ORDER BY seq) TO STDOUT (FORMAT binary)"
)
_COPY_SIGNATURE: Final = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER: Final = struct.Struct(">11sii")  # signature, flags, extension length
_COPY_FIELD: Final = struct.Struct(">i")
# A row as written: 4 fields; seq (8 bytes), two 32-byte hashes, then the bytes.
_STORED_ROW: Final = struct.Struct(">hiqi32si32si")
_GUARD = (
    "SELECT c.convalidated, pg_get_constraintdef(c.oid), p.prosrc, l.lanname, p.proconfig, "
    "pg_get_function_identity_arguments(p.oid) "
    "FROM pg_constraint c "
    "LEFT JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = c.oid "
    "AND d.refclassid = 'pg_proc'::regclass "
    "LEFT JOIN pg_proc p ON p.oid = d.refobjid "
    "LEFT JOIN pg_language l ON l.oid = p.prolang "
    "WHERE c.conrelid = 'ledger_entries'::regclass AND c.conname = %(name)s"
)
_GUARD_ARGUMENTS = (
    "entry_bytes bytea, seq bigint, entry_id uuid, kind text, "
    "recorded_at timestamp with time zone, body jsonb, prev_hash bytea"
)


def _row_to_entry(row: Sequence[Any]) -> LedgerEntry:
    seq, entry_id, kind, recorded_at, body, prev_hash, entry_hash = row
    return LedgerEntry(
        int(seq), entry_id, str(kind), recorded_at, body, bytes(prev_hash), bytes(entry_hash)
    )


Defer = Callable[[str, Sequence[Mapping[str, Any]]], None]


class PostgresLedgerWriter:
    """Appends to the chain inside the caller's transaction.

    With ``defer`` (the unit of work's commit pipeline), the sealed entries and
    the tip's move are sent together with the COMMIT instead of in a round trip
    of their own, so the tip's lock is held for one round trip less.
    """

    def __init__(self, conn: Connection, defer: Defer | None = None) -> None:
        self._conn = conn
        self._defer = defer
        # Entries sealed in this transaction but not yet sent (deferred): a
        # later append in the same transaction chains onto them.
        self._tip: tuple[int, bytes] | None = None
        self._sealed: dict[Any, LedgerEntry] = {}

    def append(self, entries: Sequence[NewLedgerEntry]) -> list[LedgerEntry]:
        """Seal and store ``entries`` after the tip; an ``entry_id`` already in
        the ledger (or earlier in ``entries``) is not stored again and its
        original entry is returned."""
        if not entries:
            return []
        raw = self._psycopg()
        ids = list({e.entry_id: e for e in entries})
        # Canonicalised before the tip's lock is taken: under it, sealing only
        # splices in the tip's hash and the sequence number, and hashes.
        prepared = {e.entry_id: prepare(e) for e in entries}
        if self._tip is None:
            with raw.pipeline():
                tip_cursor = raw.execute(_LOCK_TIP)
                found = raw.execute(_FIND, {"ids": ids})
            head = tip_cursor.fetchone()
            if head is None:
                raise RuntimeError("ledger_head has no row: is the database migrated?")
            seq, tip = head
        else:  # the lock is ours already; the tip is our own last entry
            found = raw.execute(_FIND, {"ids": ids})
            seq, tip = self._tip
        known = {entry.entry_id: entry for entry in map(_row_to_entry, found.fetchall())}
        known.update({i: self._sealed[i] for i in ids if i in self._sealed})
        fresh = list({e.entry_id: e for e in entries if e.entry_id not in known}.values())
        sealed = self._seal([prepared[e.entry_id] for e in fresh], int(seq), bytes(tip))
        by_id = {**known, **{s.entry_id: s for s in sealed}}
        return [by_id[e.entry_id] for e in entries]

    def _seal(self, fresh: Sequence[PreparedEntry], seq: int, tip: bytes) -> list[LedgerEntry]:
        if not fresh:
            return []
        sealed: list[LedgerEntry] = []
        rows: list[dict[str, Any]] = []
        previous, next_seq = tip, seq + 1
        for item in fresh:
            entry, data = item.seal(next_seq, previous)
            sealed.append(entry)
            rows.append(_params(entry, data))
            previous, next_seq = entry.entry_hash, next_seq + 1
        last = sealed[-1]
        if self._defer is not None:
            self._tip = (last.seq, last.entry_hash)
            self._sealed.update({e.entry_id: e for e in sealed})
            self._defer(_INSERT, rows)
            self._defer(_MOVE_TIP, [{"seq": last.seq, "entry_hash": last.entry_hash}])
            return sealed
        raw = self._psycopg()
        with raw.pipeline(), raw.cursor() as cursor:
            cursor.executemany(_INSERT, rows)
            cursor.execute(_MOVE_TIP, {"seq": last.seq, "entry_hash": last.entry_hash})
        return sealed

    def _psycopg(self) -> Any:
        """The psycopg connection under the caller's transaction (pipelines
        are psycopg's, not SQLAlchemy's)."""
        return self._conn.connection.driver_connection


def _params(entry: LedgerEntry, data: bytes) -> dict[str, Any]:
    from psycopg.types.json import Jsonb

    return {
        "seq": entry.seq,
        "entry_id": entry.entry_id,
        "kind": entry.kind,
        "recorded_at": entry.recorded_at,
        # jsonb keeps no formatting: orjson's text (the standard encoder's
        # where orjson refuses) stores the same value, several times faster.
        "body": Jsonb(dict(entry.body), dumps=dumps),
        "prev_hash": entry.prev_hash,
        "entry_hash": entry.entry_hash,
        "entry_bytes": data,
    }


class PostgresLedgerReader:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def entries(self, after_seq: int = 0, batch: int = 5000) -> Iterator[LedgerEntry]:
        """Every entry after ``after_seq`` in order, streamed with a server-side
        cursor so that memory stays flat however long the ledger is."""
        with self._engine.connect() as conn:
            # isoformat() of recorded_at is hashed: read it in UTC, as sealed.
            conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
            result = conn.execution_options(stream_results=True, yield_per=batch)
            rows = result.exec_driver_sql(
                f"SELECT {_COLUMNS} FROM ledger_entries WHERE seq > %(after)s ORDER BY seq",
                {"after": after_seq},
            )
            self._durable()
            for row in rows:
                yield _row_to_entry(row)

    def records(self, after_seq: int = 0, batch: int = 5000) -> Iterator[ExportRecord]:
        """Every entry after ``after_seq`` as the verifier and the export need
        it, read lean: straight from psycopg's server-side cursor, ids and
        hashes already text, no intermediate objects. Half the cost of
        :meth:`entries` per row, and the same constant memory."""
        raw = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None
            with conn.transaction():
                # isoformat() of recorded_at is hashed: read it in UTC, as sealed.
                conn.execute("SET LOCAL TIME ZONE 'UTC'")
                with conn.cursor(name="ledger_records") as cursor:
                    cursor.itersize = batch
                    cursor.execute(_RECORDS, {"after": after_seq})
                    self._durable()
                    for seq, entry_id, kind, recorded_at, body, prev_hex, entry_hex in cursor:
                        document = {
                            "v": CHAIN_VERSION,
                            "seq": seq,
                            "entry_id": entry_id,
                            "kind": kind,
                            "recorded_at": recorded_at.isoformat(),
                            "body": body,
                            "prev_hash": prev_hex,
                        }
                        yield ExportRecord(document, entry_hex)
        finally:
            raw.close()

    def _durable(self) -> None:
        """Called once a read's snapshot is taken: every entry it can see is
        on disk when this returns (entries commit with the events,
        asynchronously then flushed: service.eventstore.postgres)."""
        with self._engine.connect() as conn:
            wait_durable(conn)

    def query(self, query: LedgerQuery) -> list[LedgerEntry]:
        """One page of entries answering ``query``; pass the last ``seq`` as
        ``after_seq`` (``before_seq`` when newest first) for the next page."""
        sql, params = select_statement(query, _COLUMNS)
        with self._engine.connect() as conn:
            conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
            found = [_row_to_entry(row) for row in conn.exec_driver_sql(sql, params)]
            if found:
                # Entries commit with the events (asynchronously, then flushed):
                # show an auditor none that a crash could still take back.
                wait_durable(conn)
            return found

    def head(self) -> tuple[int, bytes]:
        with self._engine.connect() as conn:
            seq, tip = conn.exec_driver_sql("SELECT seq, entry_hash FROM ledger_head").one()
        return int(seq), bytes(tip)

    def verify(self) -> Verification:
        head = self.head()
        return verify_chain(self.entries(), head=head)

    def verify_live(
        self,
        checkpoint_note: str,
        verifier: NoteVerifier,
        older_notes: Sequence[str] = (),
        *,
        strict: bool = False,
    ) -> VerifyReport:
        """Verify the stored ledger against signed checkpoints
        (``quartermaster ledger verify --live``).

        Streams the stored bytes of every entry and hashes them as they are
        (:func:`~service.ledger.verify.verify_stored`), having first checked
        that Postgres still enforces that every row's columns are the fields of
        its bytes (:meth:`entry_bytes_guard`); the table is share-locked
        meanwhile, so that no DDL changes that between the check and the read.
        Without the guard the bytes no longer vouch for the columns: both are
        verified, the columns the slow way (serialised again and hashed), and
        the missing guard is reported as a failure of its own."""
        raw = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None
            with conn.transaction():
                conn.execute("LOCK TABLE ledger_entries IN ACCESS SHARE MODE")
                problem = _guard_problem(conn)
                report = verify_stored(
                    _stored_rows(conn, after_seq=0),
                    checkpoint_note,
                    verifier,
                    older_notes,
                    strict=strict,
                )
                if problem is None:
                    return report
                columns = verify_ledger(
                    self.records(), checkpoint_note, verifier, older_notes, strict=strict
                )
        finally:
            raw.close()
        columns.add(None, problem)
        seen = {str(p) for p in columns.problems}
        for extra in report.problems:
            if str(extra) not in seen:
                columns.add(extra.seq, extra.reason)
        return columns

    def stored(self, after_seq: int = 0) -> Iterator[StoredRow]:
        """Every entry after ``after_seq`` as stored: ``seq``, ``prev_hash``,
        ``entry_hash`` and ``entry_bytes``, streamed by binary COPY. Raises
        ``ValueError`` at once if the columns are no longer held to the bytes
        (:meth:`entry_bytes_guard`): what the tree and the signer read must
        be what queries and exports show."""
        raw = self._engine.raw_connection()
        try:
            conn = raw.driver_connection
            assert conn is not None
            with conn.transaction():
                conn.execute("LOCK TABLE ledger_entries IN ACCESS SHARE MODE")
                problem = _guard_problem(conn)
                if problem is not None:
                    raise ValueError(problem)
                # Closed here when the caller stops early: the COPY must end
                # before the transaction does.
                with contextlib.closing(_stored_rows(conn, after_seq)) as rows:
                    first = next(rows, None)
                    if first is None:
                        return
                    # The COPY's snapshot is taken: what it shows is on disk before
                    # a proof or a checkpoint names it (nothing new, no wait).
                    self._durable()
                    yield first
                    yield from rows
        finally:
            raw.close()

    def entry_bytes_guard(self) -> str | None:
        """What is wrong with the constraint that ties every row's columns to
        its ``entry_bytes`` (None: it is in place, validated, unchanged)."""
        with self._engine.connect() as conn:
            return _guard_problem(conn.connection.driver_connection)


def _guard_problem(conn: Any) -> str | None:
    """The constraint of migration 0007 must be there, validated, and call
    exactly the function that migration made; a superuser can drop it (or
    re-add it NOT VALID) to change columns behind the bytes' back."""
    found = conn.execute(_GUARD, {"name": ENTRY_MATCHES_CONSTRAINT}).fetchall()
    if len(found) != 1:
        return f"the constraint {ENTRY_MATCHES_CONSTRAINT} that ties columns to entry_bytes is gone"
    validated, definition, source, language, config, arguments = found[0]
    expected = f"CHECK ({ENTRY_MATCHES_CALL})"
    if not validated:
        return f"the constraint {ENTRY_MATCHES_CONSTRAINT} is not validated"
    if (
        definition.replace("public.", "", 1) != expected
        or source != ENTRY_MATCHES_SOURCE
        or language != "plpgsql"
        or config != ["search_path=pg_catalog"]
        or arguments != _GUARD_ARGUMENTS
    ):
        return f"the constraint {ENTRY_MATCHES_CONSTRAINT} or its function has been changed"
    return None


def _stored_rows(conn: Any, after_seq: int) -> Generator[StoredRow]:
    with conn.cursor() as cursor, cursor.copy(_STORED.format(after=int(after_seq))) as copy:
        # read() gives one CopyData message, empty at the end; iter() calls
        # it without another generator in between (this runs once per row).
        yield from _binary_rows(iter(copy.read, b""))


def _binary_rows(messages: Iterable[Any]) -> Iterator[StoredRow]:
    """Rows of a binary COPY of (seq, prev_hash, entry_hash, entry_bytes), one
    per CopyData message; the header comes with the first message."""
    messages = iter(messages)
    first = next(messages, None)
    if first is None:
        return
    head = memoryview(first)
    signature, _, extension = _COPY_HEADER.unpack_from(head)
    if signature != _COPY_SIGNATURE:
        raise ValueError("not a binary COPY stream")
    unpack, size = _STORED_ROW.unpack_from, _STORED_ROW.size
    for row in itertools.chain((head[_COPY_HEADER.size + extension :],), messages):
        length = len(row)
        if length < size:
            if length != 2:  # 2 bytes: the trailer (-1 fields)
                yield _any_row(memoryview(row))
            continue
        fields, n_seq, seq, n_prev, prev, n_hash, stated, n_data = unpack(row)
        if fields == 4 and n_seq == 8 and n_prev == 32 and n_hash == 32 and n_data == length - size:
            yield seq, prev, stated, bytes(row[size:])
        else:  # hashes of another length: the table does not forbid them
            yield _any_row(memoryview(row))


def _any_row(row: memoryview) -> StoredRow:
    """A row whose hashes are not 32 bytes (the table allows any length)."""
    values: list[bytes] = []
    offset = 2
    for _ in range(4):
        (length,) = _COPY_FIELD.unpack_from(row, offset)
        offset += 4
        values.append(bytes(row[offset : offset + max(length, 0)]))
        offset += max(length, 0)
    seq, prev, stated, data = values
    return int.from_bytes(seq, "big", signed=True), prev, stated, data


_CHECKPOINT_COLUMNS = "origin, tree_size, root_hash, note"
_SAVE_CHECKPOINT = (
    "INSERT INTO ledger_checkpoints (origin, tree_size, root_hash, note) "
    "VALUES (%(origin)s, %(size)s, %(root)s, %(note)s) ON CONFLICT (tree_size) DO NOTHING"
)


class PostgresCheckpointStore:
    """Published checkpoints, one per tree size, append-only."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def save(self, checkpoint: Checkpoint, note: str) -> str:
        """Store ``note`` (the signed ``checkpoint``); if one of that size was
        published already, that one stands and is returned."""
        params = {
            "origin": checkpoint.origin,
            "size": checkpoint.size,
            "root": checkpoint.root_hash,
            "note": note,
        }
        with self._engine.begin() as conn:
            conn.exec_driver_sql(_SAVE_CHECKPOINT, params)
            stored = conn.exec_driver_sql(
                "SELECT note FROM ledger_checkpoints WHERE tree_size = %(size)s", params
            ).scalar_one()
        return str(stored)

    def latest(self) -> tuple[Checkpoint, str] | None:
        return self._one("ORDER BY tree_size DESC LIMIT 1", {})

    def at(self, size: int) -> tuple[Checkpoint, str] | None:
        return self._one("WHERE tree_size = %(size)s", {"size": size})

    def notes(self, after_size: int = -1, limit: int = 100) -> list[str]:
        """Signed notes in order of size, for listing and for ``--older``."""
        with self._engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT note FROM ledger_checkpoints WHERE tree_size > %(after)s "
                "ORDER BY tree_size LIMIT %(limit)s",
                {"after": after_size, "limit": limit},
            )
            return [str(row[0]) for row in rows]

    def _one(self, tail: str, params: dict[str, Any]) -> tuple[Checkpoint, str] | None:
        with self._engine.connect() as conn:
            row = conn.exec_driver_sql(
                f"SELECT {_CHECKPOINT_COLUMNS} FROM ledger_checkpoints {tail}", params
            ).first()
        if row is None:
            return None
        origin, size, root, note = row
        return Checkpoint(str(origin), int(size), bytes(root)), str(note)
