"""The ledger in Postgres: chained, idempotent, and tampering found by verify
even when done as a superuser with the append-only triggers switched off (and
migration 0007's constraint dropped, where it would refuse the edit)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from service.app.uow import SqlUnitOfWork
from service.ledger import NewLedgerEntry
from service.ledger.postgres import PostgresLedgerReader
from tests.ledger.tampering import superuser, tamper

__all__ = ["superuser"]  # a fixture

T0 = datetime(2026, 11, 29, tzinfo=UTC)


def fill(engine: sa.Engine, n: int) -> list[NewLedgerEntry]:
    entries = [
        NewLedgerEntry(
            uuid.uuid4(),
            "admitted",
            {"workload": f"w{i}", "gpus": 8 * i},
            T0 + timedelta(minutes=i),
        )
        for i in range(n)
    ]
    for batch in (entries[: n // 2], entries[n // 2 :]):
        with SqlUnitOfWork(engine) as uow:
            uow.record(batch)
            uow.commit()
    return entries


def test_chain_verifies_and_appends_are_idempotent(engine: sa.Engine) -> None:
    entries = fill(engine, 8)
    with SqlUnitOfWork(engine) as uow:
        again = uow.record(entries[:2])
        uow.commit()
    reader = PostgresLedgerReader(engine)
    assert [e.seq for e in again] == [1, 2]
    assert reader.head()[0] == 8
    result = reader.verify()
    assert result.ok and result.entries == 8


def test_concurrent_appenders_keep_one_chain(engine: sa.Engine) -> None:
    from tests.eventstore.contract import run_released_together

    def append(i: int) -> None:
        for k in range(20):
            with SqlUnitOfWork(engine) as uow:
                uow.record([NewLedgerEntry(uuid.uuid4(), "admitted", {"w": i, "k": k}, T0)])
                uow.commit()

    run_released_together(8, append)
    result = PostgresLedgerReader(engine).verify()
    assert result.ok and result.entries == 160


@pytest.mark.parametrize("seq", [1, 4, 8])
def test_altered_entry_is_found(superuser: sa.Engine, seq: int) -> None:
    engine = superuser
    fill(engine, 8)
    tamper(
        engine,
        f"UPDATE ledger_entries SET body = jsonb_set(body, '{{gpus}}', '999') WHERE seq = {seq}",
        guard="drop",
    )
    result = PostgresLedgerReader(engine).verify()
    assert not result.ok and result.breaks[0].seq == seq


@pytest.mark.parametrize("seq", [1, 5, 8])
def test_removed_entry_is_found(engine: sa.Engine, seq: int) -> None:
    fill(engine, 8)
    tamper(engine, f"DELETE FROM ledger_entries WHERE seq = {seq}")
    assert not PostgresLedgerReader(engine).verify().ok


def test_reordered_entries_are_found(superuser: sa.Engine) -> None:
    engine = superuser
    fill(engine, 8)
    tamper(
        engine,
        "UPDATE ledger_entries SET seq = CASE seq WHEN 3 THEN -4 WHEN 4 THEN -3 END "
        "WHERE seq IN (3, 4)",
        "UPDATE ledger_entries SET seq = -seq WHERE seq < 0",
        guard="drop",
    )
    assert not PostgresLedgerReader(engine).verify().ok
