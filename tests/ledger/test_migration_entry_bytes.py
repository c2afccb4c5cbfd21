"""Migration 0007 on a ledger written before it: every row gets the bytes its
hash was computed over, the constraint holds, and the live ledger verifies."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from psycopg.types.json import Jsonb

from service.app.migrate import check, upgrade
from service.ledger import NewLedgerEntry
from service.ledger.chain import GENESIS_HASH, LedgerEntry, entry_bytes, seal
from service.ledger.checkpoint import NoteSigner
from service.ledger.postgres import PostgresLedgerReader
from service.ledger.proofs import LedgerTree
from tests.harness import scratch_database

T0 = datetime(2026, 11, 29, 23, 59, 59, 999999, tzinfo=UTC)


@pytest.fixture
def database(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, purpose="ledger_0007") as url:
        yield url


def _row(e: LedgerEntry) -> tuple[object, ...]:
    return (
        e.seq,
        e.entry_id,
        e.kind,
        e.recorded_at,
        Jsonb(dict(e.body)),
        e.prev_hash,
        e.entry_hash,
    )


def test_rows_written_before_0007_get_their_hashed_bytes(database: str) -> None:
    upgrade(database, "0006")
    bodies = [
        {"i": 1, "gpu_seconds": 0.5, "note": 'é \u2028 \\ "', "nested": {"b": [1, 2.25, None]}},
        {"big": 2**53 - 1, "small": 1e-7, "integral": 3.0, "empty": {}},
        {},
    ]
    entries, previous = [], GENESIS_HASH
    for i in range(2500):  # more than one batch of the back-fill
        item = NewLedgerEntry(uuid.uuid4(), "k", bodies[i % 3], T0 + timedelta(seconds=i))
        entry = seal(i + 1, item, previous)
        entries.append(entry)
        previous = entry.entry_hash
    engine = sa.create_engine(database)
    with engine.begin() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        with driver.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO ledger_entries (seq, entry_id, kind, recorded_at, body, prev_hash, "
                "entry_hash) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [_row(e) for e in entries],
            )
    upgrade(database)
    check(database)
    reader = PostgresLedgerReader(engine)
    assert [row[3] for row in reader.stored()] == [entry_bytes(e) for e in entries]
    assert reader.entry_bytes_guard() is None
    signer = NoteSigner.generate("qm.test/ledger")[0]
    tree = LedgerTree("qm.test/ledger")
    tree.extend(entries)
    assert reader.verify_live(tree.signed_checkpoint(signer), signer.verifier()).ok
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
        conn.exec_driver_sql("UPDATE ledger_entries SET kind = 'x' WHERE seq = 1")
    engine.dispose()
