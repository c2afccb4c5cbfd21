"""A unit of several appends or a large batch commits asynchronously (the
sequencer lock is not held through the WAL flush) yet is on disk before it
returns; readers that hand events or ledger entries (or proofs naming them)
outside wait for the same (docs/eventstore.md,
"The WAL flush outside the lock").

The WAL is read with pg_walinspect: the commit record of the transaction that
wrote a row must lie below the flush LSN at the moment the call returned.
Without the flush the WAL writer would write it out only within
``wal_writer_delay`` (200 ms), so reading the flush LSN at once tells. (Found
a flush that another test's commit made meanwhile, the check passes wrongly;
it never fails wrongly.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from service.app.audit import AuditService
from service.app.auth import Principal, Role
from service.app.events import EventFilter, EventQueries
from service.app.uow import SqlUnitOfWork
from service.ledger import NewLedgerEntry
from service.ledger.postgres import PostgresLedgerWriter
from service.ledger.query import LedgerQuery
from tests.eventstore.contract import new


@pytest.fixture
def walinspect(engine: sa.Engine) -> Iterator[sa.Engine]:
    with engine.begin() as conn:
        available = conn.exec_driver_sql(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"
        ).scalar()
        if not available:
            pytest.skip("this Postgres has no pg_walinspect (contrib)")
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    yield engine
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP EXTENSION IF EXISTS pg_walinspect")


def _lsn(engine: sa.Engine, function: str) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql(f"SELECT {function}()").scalar_one())


def _flushed_commit(engine: sa.Engine, since: str, until: str, position: int) -> str | None:
    """The end LSN of the commit record of the transaction that wrote the
    event at ``position``, if it lies in the WAL flushed between ``since``
    and ``until``."""
    with engine.connect() as conn:
        end = conn.exec_driver_sql(
            "SELECT w.end_lsn FROM pg_get_wal_records_info(%(since)s, %(until)s) AS w "
            "WHERE w.record_type = 'COMMIT' AND w.xid::text = "
            "(SELECT xmin::text FROM events WHERE position = %(position)s) "
            "AND w.end_lsn <= %(until)s::pg_lsn",
            {"since": since, "until": until, "position": position},
        ).scalar()
    return None if end is None else str(end)


def test_an_append_is_flushed_to_disk_before_it_returns(walinspect: sa.Engine) -> None:
    for streams, size in ((1, 1), (3, 2), (1, 100)):  # one append, several, COPY
        since = _lsn(walinspect, "pg_current_wal_insert_lsn")
        with SqlUnitOfWork(walinspect, accept=None) as uow:
            for s in range(streams):
                uow.events.append(f"durable-{size}-{s}", 0, [new(seq=i) for i in range(size)])
            result = uow.commit()[-1]
        flushed = _lsn(walinspect, "pg_current_wal_flush_lsn")
        assert _flushed_commit(walinspect, since, flushed, result.positions[-1]), (streams, size)


def test_the_append_commits_asynchronously(walinspect: sa.Engine) -> None:
    """After the append's own commit record comes the transaction that waits
    for the flush (its logical message): the append did not wait for the
    flush holding the sequencer lock."""
    since = _lsn(walinspect, "pg_current_wal_insert_lsn")
    with SqlUnitOfWork(walinspect, accept=None) as uow:  # several streams: the asynchronous kind
        uow.events.append("async-a", 0, [new(seq=0)])
        uow.events.append("async-b", 0, [new(seq=1)])
        result = uow.commit()[-1]
    flushed = _lsn(walinspect, "pg_current_wal_flush_lsn")
    commit_end = _flushed_commit(walinspect, since, flushed, result.positions[0])
    assert commit_end is not None
    with walinspect.connect() as conn:
        flushing = conn.exec_driver_sql(
            "SELECT count(*) FROM pg_get_wal_records_info(%(end)s, %(flushed)s) "
            "WHERE resource_manager = 'LogicalMessage'",
            {"end": commit_end, "flushed": flushed},
        ).scalar_one()
    assert flushing >= 1


def test_the_events_listing_shows_only_what_is_on_disk(walinspect: sa.Engine) -> None:
    """An event committed asynchronously and not yet flushed (as an append is
    between its two commits) is flushed before the listing answers with it."""
    since = _lsn(walinspect, "pg_current_wal_insert_lsn")
    with walinspect.connect() as conn:
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
        position = conn.exec_driver_sql(
            "UPDATE event_head SET position = position + 1 RETURNING position"
        ).scalar_one()
        conn.exec_driver_sql(
            "INSERT INTO events (position, stream, version, event_id, type, data, metadata) "
            "VALUES (%(p)s, 'late', 1, gen_random_uuid(), 'Noted', "
            '\'{"kind": "Workload", "namespace": "team-a"}\', \'{}\')',
            {"p": position},
        )
        conn.commit()
    admin = Principal(name="auditor", roles=frozenset({Role.ADMIN}), namespaces=frozenset({"*"}))
    listed = EventQueries(walinspect).after(admin, position - 1, EventFilter(), 10)
    flushed = _lsn(walinspect, "pg_current_wal_flush_lsn")
    assert [e["position"] for e in listed] == [position]
    assert _flushed_commit(walinspect, since, flushed, position)


def _unflushed_ledger_entry(engine: sa.Engine) -> int:
    """A ledger entry committed asynchronously and not yet flushed (as one is
    between a unit's two commits); its seq."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
        (entry,) = PostgresLedgerWriter(conn).append(
            [NewLedgerEntry(uuid.uuid4(), "admitted", {"workload": "late"}, datetime.now(UTC))]
        )
        conn.commit()
    return entry.seq


def _ledger_commit_flushed(engine: sa.Engine, since: str, seq: int) -> bool:
    flushed = _lsn(engine, "pg_current_wal_flush_lsn")
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_get_wal_records_info(%(since)s, %(until)s) AS w "
                "WHERE w.record_type = 'COMMIT' AND w.xid::text = "
                "(SELECT xmin::text FROM ledger_entries WHERE seq = %(seq)s)",
                {"since": since, "until": flushed, "seq": seq},
            ).scalar_one()
        )


def test_the_ledger_query_and_its_proofs_show_only_what_is_on_disk(
    walinspect: sa.Engine,
) -> None:
    """An auditor's query, an inclusion proof and a consistency proof each
    flush an entry not yet on disk before answering with it."""
    audit = AuditService(walinspect, None)
    auditor = Principal(name="auditor", roles=frozenset({Role.AUDITOR}), namespaces=frozenset())

    def listed(seq: int) -> bool:
        items = audit.entries(auditor, LedgerQuery(after_seq=seq - 1))["items"]
        return [e["seq"] for e in items] == [seq]

    def included(seq: int) -> bool:
        return bool(audit.inclusion(auditor, seq, None)["treeSize"] == seq)

    def consistent(seq: int) -> bool:
        return bool(audit.consistency(auditor, 1, None)["newSize"] == seq)

    for answers in (listed, included, consistent):
        since = _lsn(walinspect, "pg_current_wal_insert_lsn")
        seq = _unflushed_ledger_entry(walinspect)
        assert answers(seq), answers.__name__
        assert _ledger_commit_flushed(walinspect, since, seq), answers.__name__
