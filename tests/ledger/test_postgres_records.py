"""The lean verification reader returns what the entries give, and the hashed
``recorded_at`` reads back the same whatever the database's time zone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.ledger import NewLedgerEntry
from service.ledger.checkpoint import NoteSigner
from service.ledger.export import records_of
from service.ledger.postgres import PostgresLedgerReader
from service.ledger.proofs import LedgerTree
from service.ledger.verify import verify_ledger

T0 = datetime(2026, 11, 29, 23, 30, 0, 123456, tzinfo=UTC)


def fill(engine: sa.Engine) -> None:
    items = [
        NewLedgerEntry(uuid.uuid4(), "workload.admitted", {"i": i, "share": 0.5}, T0)
        for i in range(5)
    ]
    # The same instant written as a naive UTC time and in another offset.
    items.append(NewLedgerEntry(uuid.uuid4(), "quota.changed", {}, T0.replace(tzinfo=None)))
    items.append(
        NewLedgerEntry(
            uuid.uuid4(),
            "quota.changed",
            {},
            T0.astimezone(timezone(timedelta(hours=5, minutes=30))),
        )
    )
    with SqlUnitOfWork(engine) as uow:
        uow.record(items)
        uow.commit()


def test_records_match_the_entries(engine: sa.Engine) -> None:
    fill(engine)
    reader = PostgresLedgerReader(engine)
    assert list(reader.records()) == list(records_of(reader.entries()))
    assert [r.document["seq"] for r in reader.records(after_seq=4)] == [5, 6, 7]


def test_verifies_in_any_database_time_zone(engine: sa.Engine, database_url: str) -> None:
    fill(engine)
    signer = NoteSigner.generate("qm.test/ledger")[0]
    tree = LedgerTree("qm.test/ledger")
    tree.extend(PostgresLedgerReader(engine).entries())
    note = tree.signed_checkpoint(signer)
    name = sa.make_url(database_url).database
    with engine.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE \"{name}\" SET timezone = 'Asia/Kolkata'")
        conn.commit()
    elsewhere = sa.create_engine(database_url)
    try:
        reader = PostgresLedgerReader(elsewhere)
        with elsewhere.connect() as conn:
            assert conn.exec_driver_sql("SHOW timezone").scalar_one() == "Asia/Kolkata"
        assert reader.verify().ok
        assert verify_ledger(reader.records(), note, signer.verifier()).ok
        assert verify_ledger(records_of(reader.entries()), note, signer.verifier()).ok
        assert reader.verify_live(note, signer.verifier()).ok
        # An append here: migration 0007's constraint reads its recorded_at
        # under this time zone too.
        with SqlUnitOfWork(elsewhere) as uow:
            uow.record([NewLedgerEntry(uuid.uuid4(), "quota.changed", {}, T0)])
            uow.commit()
    finally:
        elsewhere.dispose()
        with engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" RESET timezone')
            conn.commit()


def test_repeats_in_a_batch_and_across_calls_are_stored_once(engine: sa.Engine) -> None:
    a, b, c = (NewLedgerEntry(uuid.uuid4(), "quota.changed", {"n": i}, T0) for i in range(3))
    with SqlUnitOfWork(engine) as uow:
        first = uow.record([a, b, a])
        second = uow.record([b, c])  # the same transaction, the tip already ours
        uow.commit()
    with SqlUnitOfWork(engine) as uow:
        again = uow.record([c, a])
        uow.commit()
    assert [e.seq for e in first] == [1, 2, 1]
    assert [e.seq for e in second] == [2, 3]
    assert [e.seq for e in again] == [3, 1]
    reader = PostgresLedgerReader(engine)
    assert reader.head()[0] == 3 and reader.verify().ok


def test_the_tree_catches_up_with_the_ledger(engine: sa.Engine) -> None:
    from service.ledger.memory import InMemoryLedger

    fill(engine)
    reader = PostgresLedgerReader(engine)
    tree = LedgerTree("qm.test/ledger")
    assert tree.catch_up(reader) == 7
    fill(engine)
    assert tree.catch_up(reader) == 14 and tree.catch_up(reader) == 14
    expected = LedgerTree("qm.test/ledger")
    expected.extend(reader.entries())
    assert tree.checkpoint() == expected.checkpoint()
    assert tree.checkpoint(7) == expected.checkpoint(7)
    other = InMemoryLedger()
    other.append([NewLedgerEntry(uuid.uuid4(), "x", {}, T0)])
    with pytest.raises(ValueError):
        tree.extend(other.entries)
